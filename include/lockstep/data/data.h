// lockstep/data/data.h: the data layer (distributed sampler, dataset readers).
#pragma once

#include <lockstep/data/data_error.h>
#include <lockstep/data/distributed_sampler.h>
#include <lockstep/data/elastic_sampler.h>
#include <lockstep/data/fashion_mnist.h>
