//! Admission by memory: a request joins the batch only while the projected
//! KV bytes of every admitted row stay within the budget.
//!
//! Rows of a batch are right-aligned to the longest one (see
//! [`crate::cache::BatchKvCache`]), so the batch's keys and values take
//! `rows x longest x bytes per token`: that is the projection, with each
//! row's length taken at its end (prompt plus its token limit).

/// Share of the memory available at start-up that the default budget takes.
const DEFAULT_SHARE: f64 = 0.5;

#[derive(Clone, Copy, Debug)]
pub(crate) struct KvBudget {
    pub budget_bytes: usize,
    pub bytes_per_token: usize,
}

/// Projected lengths (prompt + token limit) of admitted rows.
#[derive(Default)]
pub(crate) struct Admitted {
    lengths: Vec<(u64, usize)>,
}

impl KvBudget {
    /// KV bytes of one sequence of `tokens` positions.
    pub(crate) fn bytes_for(&self, tokens: usize) -> usize {
        tokens.saturating_mul(self.bytes_per_token)
    }

    /// Whether a request of `tokens` positions could ever run.
    pub(crate) fn fits_alone(&self, tokens: usize) -> bool {
        self.bytes_for(tokens) <= self.budget_bytes
    }

    /// Projected bytes of a batch holding rows of these lengths.
    pub(crate) fn projected(&self, lengths: impl Iterator<Item = usize>) -> usize {
        let (rows, longest) = lengths.fold((0usize, 0usize), |(n, m), l| (n + 1, m.max(l)));
        self.bytes_for(rows.saturating_mul(longest))
    }
}

impl Admitted {
    pub fn add(&mut self, id: u64, tokens: usize) {
        self.lengths.push((id, tokens));
    }

    pub fn remove(&mut self, id: u64) {
        self.lengths.retain(|&(i, _)| i != id);
    }

    /// Whether a row of `tokens` positions can join now.
    pub(crate) fn can_admit(&self, budget: &KvBudget, tokens: usize) -> bool {
        let with = self.lengths.iter().map(|&(_, l)| l).chain([tokens]);
        budget.projected(with) <= budget.budget_bytes
    }

    pub(crate) fn projected(&self, budget: &KvBudget) -> usize {
        budget.projected(self.lengths.iter().map(|&(_, l)| l))
    }
}

/// The default KV budget: a share of the memory available now (after the
/// model is loaded). Falls back to 4 GiB where the figure is unknown.
pub(crate) fn default_kv_budget_bytes() -> usize {
    match available_memory_bytes() {
        Some(bytes) => (bytes as f64 * DEFAULT_SHARE) as usize,
        None => 4 << 30,
    }
}

/// `MemAvailable` from `/proc/meminfo`.
fn available_memory_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_projection_limits_admission() {
        let budget = KvBudget {
            budget_bytes: 1000,
            bytes_per_token: 1,
        };
        let mut admitted = Admitted::default();
        assert!(admitted.can_admit(&budget, 400));
        admitted.add(1, 400);
        assert!(admitted.can_admit(&budget, 100)); // 2 x 400
        admitted.add(2, 100);
        assert!(!admitted.can_admit(&budget, 10)); // 3 x 400 > 1000
        admitted.remove(1);
        assert!(admitted.can_admit(&budget, 10)); // 2 x 100
        assert!(!budget.fits_alone(1001));
        assert_eq!(admitted.projected(&budget), 100);
    }
}
