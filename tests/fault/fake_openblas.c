/* A stand-in libblas.so.3 whose OpenBLAS "misdetects" the CPU as Prescott, so that
 * blas_test.sh can check lockstep-run's correction on any x86-64 machine (the probe finds
 * it first through LD_LIBRARY_PATH). Only the probe loads it: the ranks are shells. */
const char* openblas_get_corename(void) { return "Prescott"; }
