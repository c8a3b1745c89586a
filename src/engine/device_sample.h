// The bridge from the host sampler to sampling on the device: a Sampler's next draw as one
// DeviceSampleRow, what its ProcessLogits would change as sparse per-token adjustments. Plain
// functions; the caller owns the sampler and the batch.
#pragma once

#include "runner/device_sampling.h"
#include "sample/sampler.h"

namespace dinfer {

// Appends the row of the sampler's next draw (claiming its random step, as Sample() would) with
// its logit bias, stop-token bans and penalties; no grammar mask.
void AppendDeviceSampleRow(sample::Sampler& sampler, DeviceSampleBatch& batch);

}  // namespace dinfer
