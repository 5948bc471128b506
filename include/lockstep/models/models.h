// lockstep/models/models.h: the reference models.
#pragma once

#include <lockstep/models/convnet.h>
#include <lockstep/models/mlp.h>
