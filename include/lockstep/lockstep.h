// lockstep: synchronous data-parallel training for the PyTorch C++ API.
// The umbrella header: include this one and get every public piece.
#pragma once

#include <lockstep/comm/backend.h>
#include <lockstep/comm/init.h>
#include <lockstep/comm/process_group.h>
#include <lockstep/comm/types.h>
#include <lockstep/comm/work.h>
#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/data/data.h>
#include <lockstep/error.h>
#include <lockstep/models/models.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/ddp/hooks/powersgd_hook.h>
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>
#include <lockstep/parallel/fsdp/fsdp.h>
