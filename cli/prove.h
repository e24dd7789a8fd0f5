// `zerocheck prove`: the Z3 proofs over the engine's decision templates (see props/proofs.h).
#pragma once

namespace zc::cli {

int run_prove(unsigned timeout_ms);

}  // namespace zc::cli
