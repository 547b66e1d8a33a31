//! choreo's compiled engine: the greedy synthesis hot loop, exposed to Python through PyO3.

pub mod bitset;
pub mod greedy;

#[cfg(feature = "python")]
mod python;
