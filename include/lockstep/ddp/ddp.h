// lockstep/ddp/ddp.h: everything of the DDP layer in one include.
#pragma once

#include <lockstep/ddp/bucket_assignment.h>
#include <lockstep/ddp/distributed_data_parallel.h>
#include <lockstep/ddp/grad_bucket.h>
#include <lockstep/ddp/hooks.h>
#include <lockstep/ddp/model_check.h>
#include <lockstep/ddp/options.h>
#include <lockstep/ddp/reducer.h>
