//! Decoding as steppable state. A [`Row`] is one sequence's sampling, grammar,
//! output and timing; producers advance rows: the serial loop
//! ([`crate::generate::SerialDecoder`]), the speculative loop, and
//! [`DecodeBatch`] (many rows per forward pass), which [`BatchScheduler`]
//! feeds with prefilled rows.

mod batch;
mod row;
mod scheduler;

pub use batch::{DecodeBatch, Finished};
pub use row::{ConstraintSlot, Row};
pub use scheduler::{generate_batch, BatchItem, BatchLimits, BatchScheduler};
