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

/// The seeds are valid inputs, so fuzzing starts past the first error.
#[test]
fn seeds_parse_cleanly() {
    use mlx_bun::convert::{gguf::GgufHeader, gguf_llama, gguf_tokenizer};
    let corpus = common::repo_root().join("fuzz/corpus");

    let bytes = std::fs::read(corpus.join("gguf/tiny-llama.gguf")).unwrap();
    let h = GgufHeader::from_bytes(&bytes).unwrap();
    let tok = gguf_tokenizer::build(&h).unwrap();
    let heads = gguf_llama::Heads::read(&h).unwrap();
    assert_eq!((heads.n_head, heads.n_kv_head), (2, 1));
    gguf_llama::config(&h, &tok, true, false, "float32").unwrap();
    for t in &h.tensors {
        gguf_llama::hf_name(&t.name).unwrap();
    }

    for file in inputs(&corpus.join("safetensors_header")) {
        let bytes = std::fs::read(&file).unwrap();
        mlx_bun::model::weights::check_safetensors_bytes(&bytes).unwrap();
    }

    use mlx_bun::server::request::{parse, Endpoint};
    for file in inputs(&corpus.join("request_json")) {
        let body: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let endpoint = if body.get("messages").is_some() {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        if let Err(e) = parse(endpoint, &body, 49152) {
            panic!("{}: {}", file.display(), e.message);
        }
    }
}
