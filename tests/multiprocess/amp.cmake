# Multi-process tests of numerics/ (amp); included from tests/multiprocess/CMakeLists.txt.
