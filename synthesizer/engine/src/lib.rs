//! choreo's compiled engine: the greedy synthesis hot loop, the MSCCL lowering's passes and
//! the congestion simulator's sequential pass and the verifier's run-based data replay, exposed to Python through PyO3.

pub mod arborescence;
pub mod bitset;
pub mod greedy;
pub mod lowering;
pub mod paths;
pub mod radix;
pub mod rangeflow;
pub mod replay;

#[cfg(feature = "python")]
mod python;

/// mimalloc for every allocation the engine makes: the lowering and the greedy build many
/// short-lived vectors on several threads, and glibc's allocator spent about a third of a
/// 1,024-GPU lowering freeing and faulting them in.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
