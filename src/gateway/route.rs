//! The routing rule: which lane runs a request. The only place that decides.

/// What the request looks like, as far as routing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestShape {
    /// The request has a structured-output constraint.
    pub has_grammar: bool,
    /// The server drafts (a draft model, or prompt lookup).
    pub has_draft: bool,
    /// The request asks for log-probabilities.
    pub wants_logprobs: bool,
    /// The server batches: decode concurrency above one, and caches (of
    /// the model's layers, with the server's `--kv-bits`/`--max-kv-size`)
    /// that have a batch layout.
    pub can_batch: bool,
    /// Those batch caches also drop each row's rejected drafts, so drafting
    /// rows verify inside the batch.
    pub batch_speculates: bool,
}

/// Where a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// One request at a time on the worker, with the prompt cache.
    Serial,
    /// Draft-and-verify decoding, one request at a time.
    Speculative,
    /// Rows of the continuous batch (plain, grammar, seeded, logprobs, and
    /// drafting rows that verify in the batch's forward pass).
    Batch,
}

/// The routing rule. When the server batches, every request is a row of the
/// batch, drafting ones included, unless the batch caches cannot drop
/// rejected drafts per row (sliding windows, recurrent state): then a
/// drafting server runs requests one at a time on the speculative lane, as
/// mlx-lm does, except those asking for log-probabilities, which the
/// speculative lane does not report. Without batching: speculative when the
/// server drafts, else serial.
pub fn route(shape: RequestShape) -> Lane {
    let speculative = shape.has_draft && !shape.wants_logprobs;
    if shape.can_batch && (!shape.has_draft || shape.batch_speculates) {
        Lane::Batch
    } else if speculative {
        Lane::Speculative
    } else if shape.can_batch {
        Lane::Batch
    } else {
        Lane::Serial
    }
}

/// Why a request runs outside the batch, for `/stats`; `None` on the batch.
pub fn serial_reason(shape: RequestShape) -> Option<&'static str> {
    match route(shape) {
        Lane::Batch => None,
        _ if shape.can_batch => Some("drafting_without_batch_trim"),
        _ => Some("batching_off_or_caches_unbatchable"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(has_draft: bool, wants_logprobs: bool, can_batch: bool, trims: bool) -> RequestShape {
        RequestShape {
            has_grammar: false,
            has_draft,
            wants_logprobs,
            can_batch,
            batch_speculates: trims,
        }
    }

    #[test]
    fn routing_by_request_shape() {
        assert_eq!(route(shape(false, false, false, false)), Lane::Serial);
        assert_eq!(route(shape(false, true, false, false)), Lane::Serial);
        assert_eq!(route(shape(true, false, false, false)), Lane::Speculative);
        assert_eq!(route(shape(true, true, false, false)), Lane::Serial);
        assert_eq!(route(shape(false, false, true, false)), Lane::Batch);
        assert_eq!(route(shape(false, true, true, true)), Lane::Batch);
        // Drafting rows verify inside a batch whose caches trim per row.
        assert_eq!(route(shape(true, false, true, true)), Lane::Batch);
        assert_eq!(route(shape(true, true, true, true)), Lane::Batch);
        // Sliding-window or recurrent batches cannot drop drafts per row.
        assert_eq!(route(shape(true, false, true, false)), Lane::Speculative);
        assert_eq!(route(shape(true, true, true, false)), Lane::Batch);
        let grammar = RequestShape {
            has_grammar: true,
            ..shape(true, false, true, true)
        };
        assert_eq!(route(grammar), Lane::Batch);
    }

    #[test]
    fn serial_reasons_name_the_cause() {
        assert_eq!(serial_reason(shape(true, false, true, true)), None);
        assert_eq!(
            serial_reason(shape(true, false, true, false)),
            Some("drafting_without_batch_trim")
        );
        assert_eq!(
            serial_reason(shape(false, false, false, false)),
            Some("batching_off_or_caches_unbatchable")
        );
    }
}
