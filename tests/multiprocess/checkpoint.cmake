# Multi-process tests of numerics/ (checkpoint); included from tests/multiprocess/CMakeLists.txt.
