//! The floors of docs/architecture.md, held by reading `src/`: each file's
//! arrows (the `crate::…` paths it names, `super::` paths resolved, and the
//! external crates it names) must pass the rules below, the table of
//! "Rules between floors" in docs/architecture.md. Comments, string
//! literals and `#[cfg(test)]` modules are not read.

use std::path::Path;

struct Rule {
    /// Files under the rule: a path ending in `/` is a folder, with everything below it.
    files: &'static [&'static str],
    /// Files the rule leaves out (same form).
    except: &'static [&'static str],
    /// What they never name: `crate::m` (a module of the library) or `c` (a crate).
    never: &'static [&'static str],
    why: &'static str,
}

/// The ground floor: MLX extensions, kernels, quantization, ranks.
const GROUND: &[&str] = &[
    "src/settings.rs",
    "src/quant.rs",
    "src/collective.rs",
    "src/mlx_ext.rs",
    "src/kernels/",
];

/// Generation, free of serving and of the CLI.
const ENGINE: &[&str] = &[
    "src/model/",
    "src/cache/",
    "src/decode/",
    "src/sampling/",
    "src/kernels/",
    "src/grammar/",
    "src/prefix/",
    "src/speculative.rs",
    "src/generate.rs",
    "src/runtime.rs",
];

/// What convert, eval and train share (adapters, the differentiable forward, dataset rows).
const SHARED: &[&str] = &[
    "src/lora.rs",
    "src/autodiff/",
    "src/dataset_rows.rs",
    "src/adapters.rs",
];

const RULES: &[Rule] = &[
    Rule {
        files: &["src/"],
        except: &["src/train/"],
        never: &["crate::train"],
        why: "nothing stands on train: what others need from it lives in lora, autodiff \
              or dataset_rows",
    },
    Rule {
        files: &["src/"],
        except: &[],
        never: &["commands", "crate::commands"],
        why: "the library never reaches into the binary",
    },
    Rule {
        files: ENGINE,
        except: &[],
        never: &[
            "axum",
            "tokio",
            "clap",
            "indicatif",
            "crate::server",
            "crate::gateway",
            "crate::eval",
            "crate::convert",
            "crate::train",
        ],
        why: "the engine knows nothing of HTTP, the CLI, serving, or the tools built on it",
    },
    Rule {
        files: GROUND,
        except: &[],
        never: &[
            "crate::model",
            "crate::cache",
            "crate::distributed",
            "crate::decode",
            "crate::generate",
            "crate::speculative",
            "crate::sampling",
            "crate::grammar",
            "crate::gateway",
            "crate::server",
            "crate::train",
            "crate::eval",
            "crate::convert",
        ],
        why: "the ground stands on MLX alone; the model, its caches and all above stand on it",
    },
    Rule {
        files: &["src/model/", "src/cache/"],
        except: &[],
        never: &["crate::distributed"],
        why: "splitting a model across ranks stands on the model; the model holds only the \
              ground's Group and its own pipeline stage",
    },
    Rule {
        files: &["src/model/", "src/cache/"],
        except: &[],
        never: &[
            "crate::decode",
            "crate::generate",
            "crate::speculative",
            "crate::sampling",
            "crate::grammar",
            "crate::prefix",
            "crate::gateway",
            "crate::server",
            "crate::train",
            "crate::eval",
            "crate::convert",
        ],
        why: "a model and its caches compute logits; decoding stands on them, not under",
    },
    Rule {
        files: &["src/prefix/"],
        except: &[],
        never: &[
            "crate::gateway",
            "crate::server",
            "crate::decode",
            "axum",
            "tokio",
            "clap",
            "indicatif",
        ],
        why: "prefix storage stands on model and cache (and generate's prefill); the server \
              calls it through one PrefixStore, never the other way round",
    },
    Rule {
        files: SHARED,
        except: &[],
        never: &[
            "crate::decode",
            "crate::gateway",
            "crate::server",
            "crate::train",
            "crate::eval",
            "crate::convert",
        ],
        why: "the shared pieces stand on model and cache only, so convert, eval and train \
              can all stand on them",
    },
    Rule {
        files: &["src/eval/", "src/convert/", "src/train/"],
        except: &[],
        never: &[
            "axum",
            "tokio",
            "clap",
            "indicatif",
            "crate::server",
            "crate::gateway",
        ],
        why: "eval, convert and train sit beside serving, not on it; the CLI draws their progress",
    },
    Rule {
        files: &[
            "src/generate.rs",
            "src/sampling/",
            "src/stop.rs",
            "src/constraint.rs",
        ],
        except: &[],
        never: &["crate::decode", "crate::speculative", "crate::grammar"],
        why: "what decoders take and give (options, prompts, results, the output sink, \
              sampling, stop strings, the constraint interface) sits below the decoders",
    },
];

/// One path a file names: `crate::m` for a module of the library, else the
/// path's first segment (`tokio`, `std`, a local name).
#[derive(Debug, PartialEq)]
struct Arrow {
    line: usize,
    to: String,
}

#[test]
fn floors_only_point_down() {
    let files = sources();
    let mut broken = Vec::new();
    for (path, text) in &files {
        for rule in RULES {
            if !covers(rule.files, path) || covers(rule.except, path) {
                continue;
            }
            for arrow in arrows(path, text) {
                if rule.never.contains(&arrow.to.as_str()) {
                    broken.push(format!(
                        "{path}:{} uses {}: {}",
                        arrow.line, arrow.to, rule.why
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "arrows that break the floors (docs/architecture.md, \"Rules between floors\"):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_rules_are_not_vacuous() {
    let files = sources();
    for rule in RULES {
        for place in rule.files.iter().chain(rule.except) {
            assert!(
                files.iter().any(|(p, _)| covers(&[place], p)),
                "the rules name {place}, which holds no file: update the table"
            );
        }
    }
    let seen = |from: &str, to: &str| {
        files
            .iter()
            .filter(|(p, _)| covers(&[from], p))
            .any(|(p, text)| arrows(p, text).iter().any(|a| a.to == to))
    };
    for (from, to) in [
        ("src/decode/", "crate::cache"),
        ("src/train/", "crate::model"),
        ("src/convert/dynamic.rs", "crate::lora"),
        ("src/server/", "axum"),
        ("src/gateway/", "tokio"),
        ("src/kernels/", "crate::quant"),
        ("src/model/layers.rs", "crate::collective"),
        ("src/distributed/shard.rs", "crate::model"),
        ("src/prefix/", "crate::cache"),
        ("src/gateway/", "crate::prefix"),
    ] {
        assert!(seen(from, to), "the scanner no longer sees {from} -> {to}");
    }
}

#[test]
fn the_scanner_reads_paths_not_comments_strings_or_tests() {
    let text = r##"
//! Not `crate::train` in a doc comment.
use crate::{cache::KvCache, model::{self, Model}};
use super::sibling::Thing;
/* crate::train in a block /* nested */ comment */
fn f() -> &'static str {
    let c = '"';
    let _ = tokio::spawn(x);
    let _ = r#"crate::train in a raw string"#;
    let _ = ::clap::Parser::parse();
    "crate::train in a string"
}
#[cfg(test)]
mod tests {
    use crate::train::Thing;
}
fn g() { crate::decode::step(); }
"##;
    let seen: Vec<(usize, String)> = arrows("src/eval/x.rs", text)
        .into_iter()
        .filter(|a| a.to.starts_with("crate::") || ["tokio", "clap"].contains(&a.to.as_str()))
        .map(|a| (a.line, a.to))
        .collect();
    let expected = [
        (3, "crate::cache"),
        (3, "crate::model"),
        (4, "crate::eval"),
        (8, "tokio"),
        (10, "clap"),
        (17, "crate::decode"),
    ];
    let expected: Vec<(usize, String)> =
        expected.iter().map(|(l, t)| (*l, t.to_string())).collect();
    assert_eq!(seen, expected);
    let up = arrows("src/eval/x.rs", "use super::super::train::x;\n");
    assert_eq!(up[0].to, "crate::train");
    let up = arrows("src/eval/tasks/mod.rs", "use super::perplexity::x;\n");
    assert_eq!(up[0].to, "crate::eval");
}

/// Every `src/**/*.rs`, as (path from the repository root, text).
fn sources() -> Vec<(String, String)> {
    let out = rust_files("src");
    assert!(out.len() > 50, "src/ holds only {} files", out.len());
    out
}

/// Every `<folder>/**/*.rs`, as (path from the repository root, text).
fn rust_files(folder: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut dirs = vec![root.join(folder)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy();
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((rel.replace('\\', "/"), text));
            }
        }
    }
    out.sort();
    out
}

fn covers(places: &[&str], path: &str) -> bool {
    places.iter().any(|p| match p.strip_suffix('/') {
        Some(dir) => path.starts_with(&format!("{dir}/")),
        None => path == *p,
    })
}

/// The module path of a file: `src/eval/tasks.rs` -> `[eval, tasks]`,
/// `src/eval/mod.rs` -> `[eval]`, `src/lib.rs` -> `[]`.
fn module_of(path: &str) -> Vec<String> {
    let rel = path.strip_prefix("src/").unwrap_or(path);
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Path, // `::`
    Open,
    Close,
    Comma,
    Other(char),
}

fn arrows(path: &str, text: &str) -> Vec<Arrow> {
    let toks = tokens(&without_test_modules(&code_only(text)));
    let module = module_of(path);
    let mut out = Vec::new();
    for i in 0..toks.len() {
        let (line, Tok::Ident(first)) = &toks[i] else {
            continue;
        };
        let after_path = i > 0 && toks[i - 1].1 == Tok::Path;
        let joined =
            after_path && i > 1 && matches!(toks[i - 2].1, Tok::Ident(_) | Tok::Other('>'));
        if joined || toks.get(i + 1).map(|t| &t.1) != Some(&Tok::Path) {
            continue;
        }
        // The module the path starts from, and where its next segment is.
        let (base, mut j) = match first.as_str() {
            "crate" => (Some(Vec::new()), i + 2),
            "super" => {
                let mut base = module.clone();
                let mut j = i;
                while toks.get(j).map(|t| &t.1) == Some(&Tok::Ident("super".into()))
                    && toks.get(j + 1).map(|t| &t.1) == Some(&Tok::Path)
                {
                    base.pop();
                    j += 2;
                }
                (Some(base), j)
            }
            "self" => (None, i),
            _ => {
                out.push(Arrow {
                    line: *line,
                    to: first.clone(),
                });
                continue;
            }
        };
        let Some(base) = base else { continue };
        if !base.is_empty() {
            out.push(Arrow {
                line: toks[j].0,
                to: format!("crate::{}", base[0]),
            });
            continue;
        }
        let mut push = |t: &(usize, Tok)| {
            if let Tok::Ident(m) = &t.1 {
                if m != "self" {
                    out.push(Arrow {
                        line: t.0,
                        to: format!("crate::{m}"),
                    });
                }
            }
        };
        if toks.get(j).map(|t| &t.1) != Some(&Tok::Open) {
            if let Some(t) = toks.get(j) {
                push(t);
            }
            continue;
        }
        // `crate::{a::x, b}`: the first segment of each entry.
        let mut depth = 0;
        let mut entry_start = false;
        while let Some(t) = toks.get(j) {
            match &t.1 {
                Tok::Open => {
                    depth += 1;
                    entry_start = depth == 1;
                }
                Tok::Close => {
                    depth -= 1;
                    entry_start = false;
                }
                Tok::Comma => entry_start = depth == 1,
                Tok::Ident(_) => {
                    if depth == 1 && entry_start {
                        push(t);
                    }
                    entry_start = false;
                }
                _ => entry_start = false,
            }
            j += 1;
            if depth == 0 {
                break;
            }
        }
    }
    out
}

/// `text` with comments and the insides of string and char literals blanked
/// (newlines kept, so lines keep their numbers).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && ident(c[i - 1]);
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if let Some((quote, hashes)) = raw_string(&c, i).filter(|_| !prev_ident) {
            let close: Vec<char> = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let mut j = quote + 1;
            while j < c.len() && !c[j..].starts_with(&close) {
                j += 1;
            }
            let end = (j + close.len()).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            blank(&mut out, '"');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            // An escaped char literal: `'\n'`, `'\''`, `'\u{8}'`.
            let mut j = i + 3;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            out.push_str(&" ".repeat(j + 1 - i));
            i = j + 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Where the quote of a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` is, and its `#`s.
fn raw_string(c: &[char], i: usize) -> Option<(usize, usize)> {
    let start = match (c[i], c.get(i + 1)) {
        ('r', _) => i + 1,
        ('b', Some('r')) => i + 2,
        _ => return None,
    };
    let hashes = c[start..].iter().take_while(|&&h| h == '#').count();
    (c.get(start + hashes) == Some(&'"')).then_some((start + hashes, hashes))
}

/// `code` with every `#[cfg(test)] mod name { … }` blanked.
fn without_test_modules(code: &str) -> String {
    let mut c: Vec<char> = code.chars().collect();
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attr.len() <= c.len() {
        if c[i..].starts_with(&attr) && is_module(&c[i + attr.len()..]) {
            let mut j = i + attr.len();
            while c[j] != '{' {
                j += 1;
            }
            let mut depth = 0;
            while j < c.len() {
                match c[j] {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                j += 1;
                if depth == 0 {
                    break;
                }
            }
            for ch in &mut c[i..j] {
                if *ch != '\n' {
                    *ch = ' ';
                }
            }
            i = j;
            continue;
        }
        i += 1;
    }
    c.into_iter().collect()
}

/// Whether the item after an attribute (past any further attributes) is `mod name {`.
fn is_module(rest: &[char]) -> bool {
    let rest: String = rest.iter().take(400).collect();
    let mut item = rest.trim_start();
    while item.starts_with("#[") {
        let Some(end) = item.find(']') else {
            return false;
        };
        item = item[end + 1..].trim_start();
    }
    let item = item.strip_prefix("pub(crate) ").unwrap_or(item);
    item.strip_prefix("mod ")
        .and_then(|m| m.split_once('{'))
        .is_some_and(|(name, _)| {
            name.trim()
                .chars()
                .all(|ch| ch.is_alphanumeric() || ch == '_')
        })
}

fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
        }
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((line, Tok::Ident(c[start..i].iter().collect())));
            continue;
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            i += 1;
            Tok::Path
        } else if ch == '{' {
            Tok::Open
        } else if ch == '}' {
            Tok::Close
        } else if ch == ',' {
            Tok::Comma
        } else {
            Tok::Other(ch)
        };
        out.push((line, tok));
        i += 1;
    }
    out
}

/// Where the engine may read the process environment, and why. Everything
/// else reaches it through `settings::get()` (docs/settings.md).
const ENVIRONMENT_READERS: &[(&str, &str)] = &[
    ("src/settings.rs", "the one parser of mlx-bun's variables"),
    (
        "src/hub.rs",
        "Hugging Face's own variables (HF_HOME, HF_TOKEN, ...)",
    ),
    (
        "src/distributed/mod.rs",
        "the launch variables MLX's backends read (MLX_RANK, ...)",
    ),
    (
        "src/collective.rs",
        "the launch variables MLX's backends read (MLX_RANK, ...)",
    ),
    ("src/evaldb.rs", "HOSTNAME, recorded beside each run"),
    (
        "src/convert/dynamic.rs",
        "HOME, where mlx-lm keeps its calibration file",
    ),
];

#[test]
fn the_engine_reads_no_environment_but_its_settings() {
    let mut found = Vec::new();
    for (path, text) in sources() {
        if ENVIRONMENT_READERS.iter().any(|(p, _)| *p == path) {
            continue;
        }
        let code = without_test_modules(&code_only(&text));
        for (i, line) in code.lines().enumerate() {
            if ["env::var", "var_os(", "env::vars"]
                .iter()
                .any(|needle| line.contains(needle))
            {
                found.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if std::fs::read_to_string(&path).is_ok_and(|t| t.contains("getenv(")) {
                found.push(format!("{}: getenv", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "environment reads outside src/settings.rs (add a setting instead):\n{}",
        found.join("\n")
    );
}

/// A command that runs a model gets it from the runtime entry, which applies
/// every setting (compute dtype, adapters, draft, KV settings, memory check)
/// in one place; none loads a model folder by itself.
#[test]
fn commands_load_models_only_through_the_runtime() {
    let files = rust_files("commands");
    assert!(
        files.len() > 20,
        "commands/ holds only {} files",
        files.len()
    );
    let mut found = Vec::new();
    for (path, text) in files {
        let code = without_test_modules(&code_only(&text));
        for (i, line) in code.lines().enumerate() {
            if line.contains("Model::load") {
                found.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "commands that load a model outside runtime::Runtime::assemble:\n{}",
        found.join("\n")
    );
}
