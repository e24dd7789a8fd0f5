// The compile front end's tracing (DeepCompile's torch.compile / dynamo step, SPEC 7): deep-copy
// the module tree, make every param of the copy fake (a meta tensor of its shape, no ZeRO
// status) and run forward on MetaDevice with a meta batch, under a TracingContext, so
// ParamDict::get sees a traced forward. The original is never written: its statuses, shards and
// data are what they were, even when its ZeRO-3 params are partitioned (data undefined).
#pragma once

#include "engine/model.h"

#include <memory>

namespace zc {

struct TraceOptions {
  std::int64_t samples = 2;  // the meta batch's sample count
};

struct TracedModel {
  std::unique_ptr<Model> model;  // the fake copy the forward ran on
  DeviceCounters counters;       // what that forward would have done: kernels, FLOPs, bytes
};

// The known-bug switches are the original's engine's (its ZeRO-3 coordinator's, when it has
// one). Errors from the traced forward propagate (a UsageError names the op or param).
TracedModel trace(const Model& model, const TraceOptions& opts = {});

// Gives every param of the tree a fresh meta tensor of its shape and dtype and drops its ZeRO
// state (ds_status none, no shard), its grads: the fake params a tracer sees.
void make_params_fake(Module& m);

}  // namespace zc
