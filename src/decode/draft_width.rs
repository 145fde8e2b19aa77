//! How many tokens the batch's drafting rows propose this step. A verify
//! pass over `[rows, 1 + w]` costs more the wider it is: on a GPU barely
//! (the weights are read once for every position), on a CPU almost in
//! proportion to the positions. Each row keeps an estimate of how often its
//! drafts are accepted; the batch picks the `w` that maximizes the expected
//! tokens per second, from a cost line fitted online to its own steps.

use std::time::Duration;

/// The acceptance a row starts from, and drifts back to while it does not
/// draft (so a row that stopped drafting tries again).
const PRIOR_ACCEPTANCE: f64 = 0.7;
/// Weight of the newest observation in a row's acceptance estimate.
const ACCEPTANCE_STEP: f64 = 0.3;
/// How far a row that did not draft moves back to the prior per step.
const RECOVERY_STEP: f64 = 0.1;
/// Per-step decay of the cost fit's older observations.
const COST_DECAY: f64 = 0.97;

/// A row's running estimate of the chance that each drafted token is accepted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acceptance(f64);

impl Default for Acceptance {
    fn default() -> Self {
        Self(PRIOR_ACCEPTANCE)
    }
}

impl Acceptance {
    /// A row that does not draft: one token per step.
    pub(crate) fn never() -> Self {
        Self(0.0)
    }

    /// After a step that allowed `allowed` drafts, of which the row
    /// proposed `drafted` and the target accepted `accepted`.
    pub(crate) fn observe(&mut self, allowed: usize, drafted: usize, accepted: usize) {
        if allowed == 0 {
            self.0 += RECOVERY_STEP * (PRIOR_ACCEPTANCE - self.0);
            return;
        }
        let seen = match drafted {
            0 => 0.0,
            d if accepted >= d => 1.0,
            d => accepted as f64 / d as f64,
        };
        self.0 += ACCEPTANCE_STEP * (seen - self.0);
    }

    /// Tokens the row is expected to emit with up to `w` drafts.
    fn expected_tokens(self, w: usize) -> f64 {
        let mut total = 1.0;
        let mut p = 1.0;
        for _ in 0..w {
            p *= self.0;
            total += p;
        }
        total
    }
}

/// Seconds per verify step as a line in the positions it feeds, fitted by
/// least squares with older steps decaying.
#[derive(Clone, Default, Debug)]
pub(crate) struct StepCost {
    weight: f64,
    sum_t: f64,
    sum_tt: f64,
    sum_y: f64,
    sum_ty: f64,
}

impl StepCost {
    /// A step fed `positions` (rows times width) and took `took`.
    pub(crate) fn observe(&mut self, positions: usize, took: Duration) {
        let (t, y) = (positions as f64, took.as_secs_f64());
        for s in [
            &mut self.weight,
            &mut self.sum_t,
            &mut self.sum_tt,
            &mut self.sum_y,
            &mut self.sum_ty,
        ] {
            *s *= COST_DECAY;
        }
        self.weight += 1.0;
        self.sum_t += t;
        self.sum_tt += t * t;
        self.sum_y += y;
        self.sum_ty += t * y;
    }

    /// `(fixed, per position)` seconds, once steps of at least two widths
    /// were seen and the line rises.
    fn line(&self) -> Option<(f64, f64)> {
        let det = self.weight * self.sum_tt - self.sum_t * self.sum_t;
        if self.weight < 2.0 || det <= 1e-9 * self.weight * self.sum_tt.max(1.0) {
            return None;
        }
        let slope = (self.weight * self.sum_ty - self.sum_t * self.sum_y) / det;
        let fixed = (self.sum_y - slope * self.sum_t) / self.weight;
        (slope > 0.0).then_some((fixed.max(0.0), slope))
    }

    /// The drafts to allow each row this step: the `w <= max` that
    /// maximizes expected tokens per second over `rows`; `max` until the
    /// cost line is known.
    pub(crate) fn choose(&self, rows: &[Acceptance], max: usize) -> usize {
        let Some((fixed, slope)) = self.line() else {
            return max;
        };
        let rate = |w: usize| {
            let tokens: f64 = rows.iter().map(|a| a.expected_tokens(w)).sum();
            tokens / (fixed + slope * (rows.len() * (w + 1)) as f64)
        };
        (0..=max)
            .max_by(|&a, &b| rate(a).total_cmp(&rate(b)))
            .unwrap_or(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(fixed_ms: f64, per_position_ms: f64) -> StepCost {
        let mut c = StepCost::default();
        for t in [4, 16, 4, 8, 16] {
            let ms = fixed_ms + per_position_ms * t as f64;
            c.observe(t, Duration::from_secs_f64(ms / 1e3));
        }
        c
    }

    #[test]
    fn the_full_width_until_two_widths_were_timed() {
        let mut c = StepCost::default();
        assert_eq!(c.choose(&[Acceptance(0.1); 4], 3), 3);
        c.observe(16, Duration::from_millis(90));
        c.observe(16, Duration::from_millis(88));
        assert_eq!(c.choose(&[Acceptance(0.1); 4], 3), 3);
    }

    #[test]
    fn a_flat_cost_drafts_everything_a_steep_one_only_what_pays() {
        // Weights read once per step (a GPU): width is almost free.
        let flat = cost(20.0, 0.01);
        assert_eq!(flat.choose(&[Acceptance(0.5); 4], 6), 6);
        // Every position costs as much as the step's fixed part (a CPU).
        let steep = cost(20.0, 4.0);
        assert_eq!(steep.choose(&[Acceptance(0.3); 4], 3), 0);
        assert_eq!(steep.choose(&[Acceptance(0.99); 4], 3), 3);
    }

    #[test]
    fn acceptance_follows_the_rows_drafts_and_recovers_when_idle() {
        let mut a = Acceptance::default();
        for _ in 0..20 {
            a.observe(3, 3, 0);
        }
        assert!(a.0 < 0.01);
        for _ in 0..30 {
            a.observe(0, 0, 0);
        }
        assert!((a.0 - PRIOR_ACCEPTANCE).abs() < 0.05);
        a.observe(3, 3, 3);
        assert!(a.0 > PRIOR_ACCEPTANCE);
    }
}
