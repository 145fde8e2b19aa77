//! Replays every input the fuzzers ever crashed on (`fuzz/regressions/<target>/`,
//! saved by `scripts/fuzz.sh`) and the seed corpora (`fuzz/corpus/<target>/`)
//! through the same entry functions the libFuzzer targets call, so a fixed
//! crash stays fixed in a plain `cargo test`.

mod common;

#[path = "../fuzz/entries.rs"]
mod entries;

use std::path::Path;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn saved_fuzz_inputs_do_not_panic() {
    // The json_schema target needs the default model's tokenizer.
    common::model_dir();
    let root = common::repo_root().join("fuzz");
    let mut replayed = 0;
    for target in entries::TARGETS {
        let seeds = inputs(&root.join("corpus").join(target));
        assert!(!seeds.is_empty(), "no seed corpus for the {target} target");
        for file in seeds
            .iter()
            .chain(&inputs(&root.join("regressions").join(target)))
        {
            let data = std::fs::read(file).unwrap();
            let outcome = std::panic::catch_unwind(|| entries::run(target, &data));
            assert!(outcome.is_ok(), "{target} panicked on {}", file.display());
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} inputs");
}
