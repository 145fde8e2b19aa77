//! `bench generate` measures what `mlx_lm.benchmark` measures: the prompt it
//! draws is mlx-lm's (the first draw after `mx.random.seed(0)`, computed here
//! by the oracle), and every trial generates exactly `-g` tokens.

mod common;

use serde_json::Value;

#[test]
fn bench_generate_draws_mlx_lm_benchmarks_prompt_and_times_every_trial() {
    let model = common::model_dir();
    let out = common::run_ok(&[
        "bench",
        "generate",
        "--model",
        model.to_str().unwrap(),
        "-p",
        "12",
        "-g",
        "5",
        "-n",
        "2",
        "--json",
        "--no-db",
    ]);
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let prompt: Vec<u64> = lines[0]["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(prompt.len(), 12);
    for (i, trial) in lines[1..].iter().enumerate() {
        assert_eq!(trial["trial"], i + 1);
        for key in ["prompt_tps", "generation_tps", "total_time"] {
            let v = trial[key].as_f64().unwrap();
            assert!(v > 0.0 && v.is_finite(), "{key} = {v}");
        }
    }

    let Some(python) = common::oracle_python() else {
        return;
    };
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap();
    let script = format!(
        "import json, mlx.core as mx\n\
         mx.random.seed(0)\n\
         print(json.dumps(mx.random.randint(0, {vocab}, (1, 12)).tolist()[0]))"
    );
    let oracle = std::process::Command::new(python)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        oracle.status.success(),
        "{}",
        String::from_utf8_lossy(&oracle.stderr)
    );
    let expected: Vec<u64> = serde_json::from_slice(&oracle.stdout).unwrap();
    assert_eq!(prompt, expected, "the prompt mlx_lm.benchmark draws");
}
