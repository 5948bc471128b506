// lockstep/parallel/fsdp/fsdp.h: everything of the FSDP layer in one include.
#pragma once
#include <lockstep/parallel/fsdp/core.h>
#include <lockstep/parallel/fsdp/fully_sharded_data_parallel.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/parallel/fsdp/wrap.h>
