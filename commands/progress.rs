//! Progress bars the CLI draws from the engine's progress callbacks.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_bun::convert::hf::Event;

/// A byte-counting bar for a conversion's tensors; hidden until the first
/// event, so a command with nothing to convert draws nothing.
pub fn tensor_bar(message: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} ({elapsed}) {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
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
