//! choreo's compiled engine: the greedy synthesis hot loop and the MSCCL lowering's passes,
//! exposed to Python through PyO3.

pub mod bitset;
pub mod greedy;
pub mod lowering;

#[cfg(feature = "python")]
mod python;
