//! Progress bars the CLI draws from the engine's progress callbacks.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_bun::convert::hf::Event;

/// A bar on standard error drawn by `template` (indicatif's syntax), over
/// `len` steps; hidden when `shown` is false (a command writing JSON).
pub fn bar(template: &str, len: u64, shown: bool) -> ProgressBar {
    let target = if shown {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    let style = ProgressStyle::with_template(template).expect("a valid progress template");
    bar.set_style(style.progress_chars("=> "));
    bar
}

/// A byte-counting bar for a conversion's tensors; hidden until the first
/// event, so a command with nothing to convert draws nothing.
pub fn tensor_bar(message: &str) -> ProgressBar {
    let bar = bar(
        "{prefix} [{bar:30}] {bytes}/{total_bytes} ({elapsed}) {msg}",
        0,
        false,
    );
    bar.set_prefix(message.to_string());
    bar
}

/// Moves `bar` on by one conversion event.
pub fn advance(bar: &ProgressBar, event: Event) {
    match event {
        Event::Start { bytes, .. } => {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.set_length(bytes);
        }
        Event::Wrote { name, bytes } => {
            bar.set_message(name.to_string());
            bar.inc(bytes);
        }
    }
}
