//! How many drafts a batch step verifies. A verify pass over `[rows, w + 1]`
//! positions yields each row's accepted drafts plus one token; whether that
//! beats `w = 0` depends on the device. Where a forward pass is bound by
//! reading the weights (a GPU), more positions cost little and drafting
//! pays; where it is bound by arithmetic (a small CPU, from a few rows on),
//! `w + 1` positions cost nearly `w + 1` steps and drafting loses. So the
//! width is chosen per step from measured step times and each row's
//! measured acceptance, maximizing the expected tokens per second.

use std::collections::HashMap;

/// Each (rows, width) whose time is unknown is tried once; after that, a
/// width other than the best is retried every this many steps, so a
/// measurement taken under other conditions does not decide for good.
const RETRY_EVERY: u64 = 48;
/// Weight of a new step time in its running average.
const TIME_WEIGHT: f64 = 0.25;

/// One drafting row as the choice sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DraftOutlook {
    /// Drafts the row may take this step.
    pub want: usize,
    /// Estimated probability that the target accepts its next draft.
    pub acceptance: f64,
    /// The row's output depends on how many drafts it verifies (a sampled
    /// row draws every position with one key), so it always verifies `want`.
    pub fixed: bool,
}

impl DraftOutlook {
    /// Tokens the row expects from a step that verifies up to `width` of its
    /// drafts: the target's token plus each draft while the chain holds.
    fn expected_tokens(&self, width: usize) -> f64 {
        let drafts = if self.fixed {
            self.want
        } else {
            self.want.min(width)
        };
        let mut total = 1.0;
        let mut chain = 1.0;
        for _ in 0..drafts {
            chain *= self.acceptance;
            total += chain;
        }
        total
    }
}

/// Step times per (rows, width) and the choice they lead to.
#[derive(Debug, Default)]
pub(crate) struct DraftWidths {
    /// Running average of a step's seconds, by (rows, width).
    seconds: HashMap<(usize, usize), f64>,
    /// Steps chosen, by rows: paces the retries.
    steps: HashMap<usize, u64>,
}

impl DraftWidths {
    /// The width for a step of `rows` rows (`drafting` of them draft): the
    /// one with the most expected tokens per second. A width never measured
    /// for this many rows is taken first; it is also at least the widest
    /// `fixed` row's `want` (those rows pay for that width anyway).
    pub(crate) fn choose(&mut self, rows: usize, drafting: &[DraftOutlook]) -> usize {
        let widest = drafting.iter().map(|d| d.want).max().unwrap_or(0);
        let floor = drafting
            .iter()
            .filter(|d| d.fixed)
            .map(|d| d.want)
            .max()
            .unwrap_or(0);
        if widest == floor {
            return widest;
        }
        let step = {
            let s = self.steps.entry(rows).or_default();
            *s += 1;
            *s
        };
        // Untried widths first, widest first: on a device where drafting
        // pays, the first steps already draft.
        if let Some(w) = (floor..=widest)
            .rev()
            .find(|w| !self.seconds.contains_key(&(rows, *w)))
        {
            return w;
        }
        let rate = |w: usize| {
            let tokens = (rows - drafting.len()) as f64
                + drafting.iter().map(|d| d.expected_tokens(w)).sum::<f64>();
            tokens / self.seconds[&(rows, w)]
        };
        let best = (floor..=widest)
            .max_by(|a, b| rate(*a).total_cmp(&rate(*b)))
            .unwrap_or(widest);
        if step % RETRY_EVERY == 0 {
            // The others in turn.
            let others: Vec<usize> = (floor..=widest).filter(|&w| w != best).collect();
            return others[(step / RETRY_EVERY) as usize % others.len()];
        }
        best
    }

    /// A step of `rows` rows that verified up to `width` drafts took `seconds`.
    pub(crate) fn record(&mut self, rows: usize, width: usize, seconds: f64) {
        self.seconds
            .entry((rows, width))
            .and_modify(|s| *s += TIME_WEIGHT * (seconds - *s))
            .or_insert(seconds);
    }
}

/// A row's acceptance as a chain of drafts: each verify step shows some
/// drafts accepted, then either a rejection (the chain broke; also when the
/// drafter had nothing more to offer) or the end of what was offered (no
/// evidence either way). Estimates the probability of the next acceptance
/// from recent steps, starting from an even prior.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AcceptanceEstimate {
    accepted: f64,
    rejected: f64,
}

/// Weight of earlier steps against the latest in [`AcceptanceEstimate`].
const ACCEPTANCE_DECAY: f64 = 0.9;

impl AcceptanceEstimate {
    /// Of `offered` positions the row could fill with drafts this step,
    /// the target accepted `accepted`.
    pub(crate) fn observe(&mut self, offered: usize, accepted: usize) {
        if offered == 0 {
            return;
        }
        self.accepted = ACCEPTANCE_DECAY * self.accepted + accepted as f64;
        self.rejected = ACCEPTANCE_DECAY * self.rejected + f64::from(u8::from(accepted < offered));
    }

    /// The estimated probability that the next draft is accepted.
    pub(crate) fn probability(&self) -> f64 {
        (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(want: usize, acceptance: f64) -> DraftOutlook {
        DraftOutlook {
            want,
            acceptance,
            fixed: false,
        }
    }

    /// Tries every width once, then settles on the best by its times.
    fn settle(
        widths: &mut DraftWidths,
        rows: usize,
        drafting: &[DraftOutlook],
        time: impl Fn(usize) -> f64,
    ) -> usize {
        for _ in 0..8 {
            let w = widths.choose(rows, drafting);
            widths.record(rows, w, time(w));
        }
        widths.choose(rows, drafting)
    }

    #[test]
    fn drafts_where_positions_are_cheap_and_not_where_they_cost_a_step() {
        let drafting = [row(4, 0.7); 4];
        // Bound by reading the weights: a position costs 5 % of a step.
        let mut gpu = DraftWidths::default();
        assert_eq!(
            settle(&mut gpu, 4, &drafting, |w| 1.0
                + 0.02 * (4 * (w + 1)) as f64),
            4
        );
        // Bound by arithmetic: every position costs its share.
        let mut cpu = DraftWidths::default();
        assert_eq!(settle(&mut cpu, 4, &drafting, |w| (4 * (w + 1)) as f64), 0);
        // In between, the chain's tail stops paying before the fourth draft.
        let mut mid = DraftWidths::default();
        let fair = [row(4, 0.6); 4];
        assert_eq!(
            settle(&mut mid, 4, &fair, |w| 1.0 + 0.1 * (4 * (w + 1)) as f64),
            2
        );
    }

    #[test]
    fn untried_widths_go_first_and_others_are_retried() {
        let drafting = [row(2, 0.9)];
        let mut widths = DraftWidths::default();
        let tried: Vec<usize> = (0..3)
            .map(|_| {
                let w = widths.choose(1, &drafting);
                widths.record(1, w, 1.0 + w as f64);
                w
            })
            .collect();
        assert_eq!(tried, [2, 1, 0]);
        let chosen: Vec<usize> = (0..2 * RETRY_EVERY)
            .map(|_| widths.choose(1, &drafting))
            .collect();
        let best = chosen[0];
        assert!(
            chosen.iter().filter(|&&w| w != best).count() == 2,
            "{chosen:?}"
        );
    }

    #[test]
    fn sampled_rows_keep_their_width() {
        let drafting = [
            DraftOutlook {
                want: 3,
                acceptance: 0.1,
                fixed: true,
            },
            row(5, 0.1),
        ];
        let mut widths = DraftWidths::default();
        for _ in 0..10 {
            let w = widths.choose(2, &drafting);
            assert!(w >= 3);
            widths.record(2, w, (w + 1) as f64);
        }
        // Nothing to choose: every row's width is fixed.
        assert_eq!(widths.choose(1, &drafting[..1]), 3);
    }

    #[test]
    fn acceptance_follows_recent_chains() {
        let mut a = AcceptanceEstimate::default();
        assert_eq!(a.probability(), 0.5);
        for _ in 0..30 {
            a.observe(4, 4);
        }
        assert!(a.probability() > 0.95);
        for _ in 0..30 {
            a.observe(4, 0);
        }
        assert!(a.probability() < 0.25, "{}", a.probability());
        // Nothing offered, nothing learned.
        let before = a.probability();
        a.observe(0, 0);
        assert_eq!(a.probability(), before);
    }
}
