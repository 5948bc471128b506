// lockstep/parallel/ddp/ddp.h: everything of the DDP layer in one include.
#pragma once

#include <lockstep/parallel/ddp/bucket_assignment.h>
#include <lockstep/parallel/ddp/distributed_data_parallel.h>
#include <lockstep/parallel/ddp/grad_bucket.h>
#include <lockstep/parallel/ddp/hooks/default_hooks.h>
#include <lockstep/parallel/ddp/model_check.h>
#include <lockstep/parallel/ddp/options.h>
#include <lockstep/parallel/ddp/reducer.h>
