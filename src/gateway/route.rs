//! The routing rule: which lane runs a request. The only place that decides.

/// What the request looks like, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestShape {
    pub has_grammar: bool,
    pub has_draft: bool,
    pub wants_logprobs: bool,
    /// The server batches: decode concurrency above one, and caches (of
    /// the model's layers, with the server's `--kv-bits`/`--max-kv-size`)
    /// that have a batch layout.
    pub can_batch: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// One request at a time on the worker, with the prompt cache.
    Serial,
    /// Draft-and-verify decoding with the server's draft model.
    Speculative,
    /// Rows of the continuous batch (plain, grammar, seeded, logprobs).
    Batch,
}

/// The routing rule. A draft model sends requests to the speculative lane
/// (as mlx-lm does: speculation and batching do not mix), except those
/// asking for log-probabilities, which the speculative lane does not report.
/// Everything else runs as a row of the batch when the server batches, else
/// serially.
pub fn route(shape: RequestShape) -> Lane {
    if shape.has_draft && !shape.wants_logprobs {
        Lane::Speculative
    } else if shape.can_batch {
        Lane::Batch
    } else {
        Lane::Serial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_by_request_shape() {
        let shape = |has_draft, has_grammar, wants_logprobs, can_batch| RequestShape {
            has_grammar,
            has_draft,
            wants_logprobs,
            can_batch,
        };
        assert_eq!(route(shape(false, false, false, false)), Lane::Serial);
        assert_eq!(route(shape(false, true, true, false)), Lane::Serial);
        assert_eq!(route(shape(true, false, false, false)), Lane::Speculative);
        assert_eq!(route(shape(true, true, false, false)), Lane::Speculative);
        assert_eq!(route(shape(true, false, true, false)), Lane::Serial);
        assert_eq!(route(shape(false, false, false, true)), Lane::Batch);
        assert_eq!(route(shape(false, true, true, true)), Lane::Batch);
        assert_eq!(route(shape(true, true, false, true)), Lane::Speculative);
        assert_eq!(route(shape(true, false, true, true)), Lane::Batch);
    }
}
