//! Optimizers (Adam, AdamW, SGD with MLX's update rules), learning-rate
//! schedules with warmup, and global gradient-norm clipping, all on flat
//! lists of arrays.

use anyhow::{bail, Result};
use mlx_rs::ops::{sqrt, square};
use mlx_rs::Array;

use super::config::{LrScheduleConfig, OptimizerKind, OptimizerSettings};

/// A learning rate as a function of the update count (0-based).
#[derive(Clone, Debug)]
pub enum Schedule {
    /// The same rate at every step.
    Constant(f64),
    /// `end + (init - end) * (1 + cos(pi * min(step, steps) / steps)) / 2`
    Cosine {
        /// The rate at step 0.
        init: f64,
        /// Steps of the decay.
        steps: usize,
        /// The rate from `steps` on.
        end: f64,
    },
    /// Linear from `init` to `end` over `steps`, then `end`.
    Linear {
        /// The rate at step 0.
        init: f64,
        /// The rate from `steps` on.
        end: f64,
        /// Steps of the ramp.
        steps: usize,
    },
    /// `warmup` linear steps from `from` to the start of `then`, then `then`
    /// (counted from the end of the warmup), as mlx-lm joins them.
    Warmup {
        /// The rate at step 0 of the warmup.
        from: f64,
        /// Warmup steps.
        steps: usize,
        /// The schedule after the warmup.
        then: Box<Schedule>,
    },
}

impl Schedule {
    /// The learning rate of update `step` (0-based).
    pub fn at(&self, step: usize) -> f64 {
        match self {
            Schedule::Constant(lr) => *lr,
            Schedule::Cosine { init, steps, end } => {
                let s = step.min(*steps) as f64;
                let decay = 0.5 * (1.0 + (std::f64::consts::PI / *steps as f64 * s).cos());
                end + decay * (init - end)
            }
            Schedule::Linear { init, end, steps } => {
                let s = step.min(*steps) as f64;
                s * ((end - init) / *steps as f64) + init
            }
            Schedule::Warmup { from, steps, then } => {
                // mlx-lm: linear_schedule(from, init, steps) joined at steps + 1.
                if step < steps + 1 {
                    let init = then.at(0);
                    let s = step.min(*steps) as f64;
                    s * ((init - from) / *steps as f64) + from
                } else {
                    then.at(step - (steps + 1))
                }
            }
        }
    }

    /// A schedule from mlx-lm's `lr_schedule` option, or the constant `lr`.
    pub(crate) fn from_config(lr: f64, cfg: Option<&LrScheduleConfig>) -> Result<Self> {
        let Some(cfg) = cfg else {
            return Ok(Schedule::Constant(lr));
        };
        let a = &cfg.arguments;
        let need = |n: usize| -> Result<()> {
            if a.len() < n {
                bail!(
                    "lr_schedule {} needs at least {n} arguments, got {}",
                    cfg.name,
                    a.len()
                );
            }
            Ok(())
        };
        let base = match cfg.name.as_str() {
            "cosine_decay" | "cosine" => {
                need(2)?;
                if a[1] < 1.0 {
                    bail!("cosine_decay needs decay_steps >= 1");
                }
                Schedule::Cosine {
                    init: a[0],
                    steps: a[1] as usize,
                    end: a.get(2).copied().unwrap_or(0.0),
                }
            }
            "linear_schedule" | "linear" => {
                need(3)?;
                if a[2] < 1.0 {
                    bail!("linear_schedule needs steps >= 1");
                }
                Schedule::Linear {
                    init: a[0],
                    end: a[1],
                    steps: a[2] as usize,
                }
            }
            "constant" => {
                need(1)?;
                Schedule::Constant(a[0])
            }
            other => bail!(
                "unknown lr_schedule {other:?} (supported: cosine_decay, linear_schedule, constant)"
            ),
        };
        Ok(if cfg.warmup > 0 {
            Schedule::Warmup {
                from: cfg.warmup_init,
                steps: cfg.warmup,
                then: Box::new(base),
            }
        } else {
            base
        })
    }
}

/// The optimizer and its per-parameter state.
pub struct Optimizer {
    kind: OptimizerKind,
    schedule: Schedule,
    betas: [f32; 2],
    eps: f32,
    weight_decay: f32,
    momentum: f32,
    bias_correction: bool,
    /// `m`/`v` (Adam) or the momentum buffer (SGD, in `.0`) per parameter.
    state: Vec<(Array, Array)>,
    step: usize,
}

impl Optimizer {
    /// An optimizer of `kind` with `settings` (unset ones take MLX's defaults; AdamW's weight decay 0.01) and the learning-rate `schedule`.
    pub fn new(kind: OptimizerKind, settings: &OptimizerSettings, schedule: Schedule) -> Self {
        Self {
            kind,
            schedule,
            betas: settings.betas.unwrap_or([0.9, 0.999]),
            eps: settings.eps.unwrap_or(1e-8),
            weight_decay: settings.weight_decay.unwrap_or(match kind {
                OptimizerKind::Adamw => 0.01,
                _ => 0.0,
            }),
            momentum: settings.momentum.unwrap_or(0.0),
            bias_correction: settings.bias_correction.unwrap_or(false),
            state: Vec::new(),
            step: 0,
        }
    }

    /// The learning rate the next update uses.
    pub fn learning_rate(&self) -> f64 {
        self.schedule.at(self.step)
    }

    /// Updates applied so far.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// Arrays to evaluate together with the parameters after an update.
    pub(crate) fn state_arrays(&self) -> Vec<&Array> {
        self.state.iter().flat_map(|(a, b)| [a, b]).collect()
    }

    /// Applies one update; returns the new parameters.
    pub fn update(&mut self, params: &[Array], grads: &[Array]) -> Result<Vec<Array>> {
        if params.len() != grads.len() {
            bail!("{} parameters but {} gradients", params.len(), grads.len());
        }
        if self.state.is_empty() {
            self.state = params
                .iter()
                .map(|p| {
                    Ok((
                        Array::zeros::<f32>(p.shape())?,
                        Array::zeros::<f32>(p.shape())?,
                    ))
                })
                .collect::<Result<_>>()?;
        }
        let lr = self.learning_rate() as f32;
        self.step += 1;
        let mut out = Vec::with_capacity(params.len());
        for ((p, g), (s0, s1)) in params.iter().zip(grads).zip(self.state.iter_mut()) {
            let next = match self.kind {
                OptimizerKind::Sgd => {
                    let g = if self.weight_decay != 0.0 {
                        g + &(p * self.weight_decay)
                    } else {
                        g.clone()
                    };
                    if self.momentum <= 0.0 {
                        p - &(&g * lr)
                    } else {
                        let v = &(&*s0 * self.momentum) + &g;
                        let next = p - &(&v * lr);
                        *s0 = v;
                        next
                    }
                }
                OptimizerKind::Adam | OptimizerKind::Adamw => {
                    let p = if self.kind == OptimizerKind::Adamw {
                        p * (1.0 - lr * self.weight_decay)
                    } else {
                        p.clone()
                    };
                    let [b1, b2] = self.betas;
                    let m = &(&*s0 * b1) + &(g * (1.0 - b1));
                    let v = &(&*s1 * b2) + &(&square(g)? * (1.0 - b2));
                    let next = if self.bias_correction {
                        let t = self.step as i32;
                        let c1 = lr / (1.0 - b1.powi(t));
                        let c2 = 1.0 / (1.0 - b2.powi(t)).sqrt();
                        &p - &(&(&m * c1) / &(&(&sqrt(&v)? * c2) + self.eps))
                    } else {
                        &p - &(&(&m * lr) / &(&sqrt(&v)? + self.eps))
                    };
                    *s0 = m;
                    *s1 = v;
                    next
                }
            };
            out.push(next);
        }
        Ok(out)
    }
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (MLX's
/// `clip_grad_norm`). Returns the clipped gradients and the original norm.
pub(crate) fn clip_grad_norm(grads: &[Array], max_norm: f32) -> Result<(Vec<Array>, Array)> {
    let mut total = Array::from_f32(0.0);
    for g in grads {
        total = &total + &square(g)?.sum(None)?;
    }
    let norm = sqrt(&total)?;
    let scale = mlx_rs::ops::minimum(
        &(&Array::from_f32(max_norm) / &(&norm + 1e-6f32)),
        Array::from_f32(1.0),
    )?;
    let clipped = grads.iter().map(|g| g * &scale).collect();
    Ok((clipped, norm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_matches_mlx_lm_join() {
        let cfg = LrScheduleConfig {
            name: "cosine_decay".into(),
            arguments: vec![1e-3, 10.0, 0.0],
            warmup: 4,
            warmup_init: 0.0,
        };
        let s = Schedule::from_config(1.0, Some(&cfg)).unwrap();
        assert_eq!(s.at(0), 0.0);
        assert!((s.at(2) - 5e-4).abs() < 1e-12);
        assert!((s.at(4) - 1e-3).abs() < 1e-12);
        assert!((s.at(5) - 1e-3).abs() < 1e-12);
        assert!(s.at(10) < 1e-3 && s.at(10) > 0.0);
        assert!(s.at(100).abs() < 1e-12);
    }

    #[test]
    fn adam_step_matches_the_formula() {
        let mut opt = Optimizer::new(
            OptimizerKind::Adam,
            &OptimizerSettings::default(),
            Schedule::Constant(0.1),
        );
        let p = [Array::from_slice(&[1.0f32, -2.0], &[2])];
        let g = [Array::from_slice(&[0.5f32, 0.0], &[2])];
        let next = opt.update(&p, &g).unwrap();
        let v: Vec<f32> = next[0].as_slice().to_vec();
        // m = 0.05, v = 0.00025 -> step = 0.1 * 0.05 / (0.0158114 + 1e-8)
        let expect = 1.0 - 0.1 * 0.05 / (0.00025f32.sqrt() + 1e-8);
        assert!((v[0] - expect).abs() < 1e-5, "{v:?} vs {expect}");
        assert_eq!(v[1], -2.0);
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let g = [Array::from_slice(&[3.0f32, 4.0], &[2])];
        let (c, n) = clip_grad_norm(&g, 1.0).unwrap();
        assert!((n.item_cast::<f32>() - 5.0).abs() < 1e-6);
        let v: Vec<f32> = c[0].as_slice().to_vec();
        assert!((v[0] - 0.6).abs() < 1e-5 && (v[1] - 0.8).abs() < 1e-5);
    }
}
