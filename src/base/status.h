// Status lives in the public headers (include/dinfer/status.h); internal code includes it here.
#pragma once

#include "dinfer/status.h"
