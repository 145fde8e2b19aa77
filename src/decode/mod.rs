//! Decoding as steppable state. A [`Row`] is one sequence's sampling, grammar,
//! drafter, output and timing; producers advance rows: the serial loop
//! (`SerialDecoder`), the speculative loop
//! (`SpeculativeDecoder`, one row drafting and verifying), and [`DecodeBatch`]
//! (many rows per forward pass, drafting rows verified together), which
//! [`BatchScheduler`] feeds with prefilled rows.

mod batch;
mod row;
mod scheduler;
mod serial;
mod speculative;

pub use batch::{DecodeBatch, Finished};
pub use row::{ConstraintSlot, Row};
pub use scheduler::{generate_batch, BatchItem, BatchLimits, BatchScheduler};
pub(crate) use serial::SerialDecoder;
pub(crate) use speculative::SpeculativeDecoder;
