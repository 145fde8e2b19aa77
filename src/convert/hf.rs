//! A Hugging Face checkpoint (or an mlx-lm folder) into an mlx-lm model
//! folder, as `mlx_lm.convert --hf-path` writes it: mlx-lm's tensor names,
//! casts, quantization (affine, mxfp4, nvfp4, mxfp8, the mixed recipes),
//! shards, index, config and model card.
//!
//! It streams: the input shards are opened lazily, each tensor (or quantized
//! layer) is computed, written at its place in the output shard and dropped,
//! so peak memory stays near the largest tensor instead of the whole model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};

use super::family::{self, Family};
use super::output::{self, Commit, StagingDir};
use super::quantize::{dequantize_with_mode, quantize_with_mode};
use super::safetensors_out::{self, ShardWriter, TensorInfo};
use crate::mlx_ext::{is_float, parse_dtype};
use crate::model::weights::layer_quant_spec;
use crate::quant::{QuantMode, Quantization};

/// mlx-lm's mixed-bit recipes (`--quant-predicate`), after llama.cpp's
/// Q*_K_M choices: `(low bits, high bits)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixedRecipe {
    /// `mixed_2_6`: 2 bits, 6 bits for the sensitive layers.
    Mixed2_6,
    /// `mixed_3_4`: 3 bits, 4 bits for the sensitive layers.
    Mixed3_4,
    /// `mixed_3_6`: 3 bits, 6 bits for the sensitive layers.
    Mixed3_6,
    /// `mixed_4_6`: 4 bits, 6 bits for the sensitive layers.
    Mixed4_6,
}

impl MixedRecipe {
    /// The recipe named by `--quant-predicate` (`mixed_2_6` etc.).
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "mixed_2_6" => Self::Mixed2_6,
            "mixed_3_4" => Self::Mixed3_4,
            "mixed_3_6" => Self::Mixed3_6,
            "mixed_4_6" => Self::Mixed4_6,
            other => bail!(
                "unknown quantization recipe {other:?} (choose mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6)"
            ),
        })
    }

    fn bits(self) -> (i32, i32) {
        match self {
            Self::Mixed2_6 => (2, 6),
            Self::Mixed3_4 => (3, 4),
            Self::Mixed3_6 => (3, 6),
            Self::Mixed4_6 => (4, 6),
        }
    }
}

/// How to quantize (`-q` with `--q-mode`, `--q-bits`, `--q-group-size`,
/// `--quant-predicate`). None values take the mode's defaults.
#[derive(Clone, Copy, Debug)]
pub struct QuantRecipe {
    /// The quantization mode (`--q-mode`, default affine).
    pub mode: QuantMode,
    /// Weights per scale (`--q-group-size`); None: the mode's default.
    pub group_size: Option<i32>,
    /// Bits per weight (`--q-bits`); None: the mode's default.
    pub bits: Option<i32>,
    /// A mixed-bit recipe (`--quant-predicate`), affine only.
    pub mixed: Option<MixedRecipe>,
}

impl QuantRecipe {
    fn resolved(&self) -> (i32, i32) {
        let (g, b) = self.mode.defaults();
        (self.group_size.unwrap_or(g), self.bits.unwrap_or(b))
    }

    /// Checks the group size and bits against the mode, and that a mixed recipe is affine.
    pub fn validate(&self) -> Result<()> {
        let (g, b) = self.resolved();
        self.mode.validate(g, b)?;
        if self.mixed.is_some() && self.mode != QuantMode::Affine {
            bail!("--quant-predicate recipes only use affine quantization (drop --q-mode)");
        }
        Ok(())
    }
}

/// What to write.
#[derive(Clone, Debug, Default)]
pub struct HfOptions {
    /// The directory the model is written to (`--mlx-path`).
    pub output: PathBuf,
    /// The dtype of floating tensors; None: `torch_dtype` of config.json.
    pub dtype: Option<Dtype>,
    /// Quantize the model this way (`-q`).
    pub quantize: Option<QuantRecipe>,
    /// Store quantized layers as dense floating weights (`--dequantize`).
    pub dequantize: bool,
    /// The Hub repo the model came from (the card's `base_model`).
    pub base_model: Option<String>,
}

/// What the engine reports while it works; the CLI draws it.
pub enum Event<'a> {
    /// The plan is made: this many tensors and bytes will be written.
    Start {
        /// Tensors to write.
        tensors: usize,
        /// Bytes of tensor data to write.
        bytes: u64,
    },
    /// One tensor was written.
    Wrote {
        /// The tensor's name.
        name: &'a str,
        /// Its size in bytes.
        bytes: u64,
    },
}

/// What a conversion wrote.
#[derive(Debug)]
pub struct HfSummary {
    /// The directory the model was written to.
    pub output: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Safetensors shards written (at most 5 GiB each).
    pub shards: usize,
    /// Parameters of the model (quantized weights counted unpacked).
    pub parameters: u64,
    /// Bits per weight over the whole model (mlx-lm's `compute_bits_per_weight`).
    pub bits_per_weight: f64,
    /// The `quantization` entry written to `config.json`, if the model is quantized.
    pub quantization: Option<Value>,
    /// `AlreadyThere` when a concurrent conversion placed the output first.
    pub commit: Commit,
}

/// The quantization of one layer: mode, group size, bits.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LayerQuant {
    mode: QuantMode,
    group_size: i32,
    bits: i32,
}

impl LayerQuant {
    fn json(&self) -> Value {
        json!({"group_size": self.group_size, "bits": self.bits, "mode": self.mode.name()})
    }
}

/// One step of the output: a tensor copied (maybe cast), a layer quantized,
/// or a quantized input layer dequantized or cast.
enum Unit {
    Plain(String),
    Quantize(String, LayerQuant),
    Packed(String, LayerQuant),
}

impl Unit {
    /// The path of the module that holds the unit's tensors.
    fn module(&self) -> &str {
        match self {
            Unit::Plain(name) => name.rsplit_once('.').map_or("", |(m, _)| m),
            Unit::Quantize(prefix, _) | Unit::Packed(prefix, _) => prefix,
        }
    }
}

/// The modules with submodules: mlx-lm counts only the parameters of leaf
/// modules (so not, say, a DeltaNet's own `A_log`).
fn inner_modules(units: &[Unit]) -> HashSet<String> {
    let mut inner = HashSet::new();
    for unit in units {
        let mut module = unit.module();
        while let Some((parent, _)) = module.rsplit_once('.') {
            inner.insert(parent.to_string());
            module = parent;
        }
    }
    inner
}

struct Source {
    dir: PathBuf,
    config: Map<String, Value>,
    family: &'static Family,
    tensors: HashMap<String, Array>,
    /// Input layers already quantized (prefix → how).
    packed: BTreeMap<String, LayerQuant>,
}

/// Orders names with their numbers compared as numbers (`layers.2` before `layers.10`).
fn natural_key(name: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    for part in name.split('.') {
        match part.parse::<u64>() {
            Ok(n) => key.push((n, String::new())),
            Err(_) => key.push((u64::MAX, part.to_string())),
        }
    }
    key
}

fn read_json_object(path: &Path) -> Result<Map<String, Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))? {
        Value::Object(map) => Ok(map),
        _ => bail!("{} is not a JSON object", path.display()),
    }
}

/// The weight files mlx-lm reads: `model*.safetensors`.
fn input_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.starts_with("model") && name.ends_with(".safetensors")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} has no model*.safetensors weight files", dir.display());
    }
    Ok(files)
}

fn mlx_error(e: impl std::fmt::Display) -> anyhow::Error {
    let text = e.to_string();
    anyhow!("{}", text.split(" at /").next().unwrap_or(&text).trim())
}

impl Source {
    fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!("model directory {} does not exist", dir.display());
        }
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            bail!(
                "{} is not a Hugging Face or mlx-lm model directory (it has no config.json)",
                dir.display()
            );
        }
        let mut config = read_json_object(&config_path)?;
        // mlx-lm's load_config: generation_config.json's eos ids win.
        let generation = dir.join("generation_config.json");
        if generation.is_file() {
            if let Ok(g) = read_json_object(&generation) {
                if let Some(eos) = g.get("eos_token_id").filter(|v| truthy(v)) {
                    config.insert("eos_token_id".into(), eos.clone());
                }
            }
        }
        let family = family::of_config(&Value::Object(config.clone()))
            .with_context(|| format!("reading {}", config_path.display()))?;
        if let Some(q) = config.get("quantization_config") {
            let method = q
                .get("quant_method")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string();
            let folded_fp8 = family.reads_fp8() && super::fp8::is_scaled_fp8(q);
            if method == "mxfp4" && family.reads_mxfp4() && !config.contains_key("quantization") {
                // mlx-lm's loader reads such a checkpoint as mxfp4 layers.
                config.insert(
                    "quantization".into(),
                    json!({"group_size": 32, "bits": 4, "mode": "mxfp4"}),
                );
            }
            if !folded_fp8 && !config.contains_key("quantization") {
                bail!(
                    "{} is quantized with {method:?}, which convert cannot read; start from the float checkpoint",
                    dir.display()
                );
            }
        }
        let mut tensors = HashMap::new();
        for file in input_files(dir)? {
            let loaded = Array::load_safetensors(&file)
                .map_err(mlx_error)
                .with_context(|| format!("opening {}", file.display()))?;
            for (name, array) in loaded {
                if tensors.insert(name.clone(), array).is_some() {
                    bail!(
                        "tensor {name} appears in more than one weight file of {}",
                        dir.display()
                    );
                }
            }
        }
        family
            .rewrite(&mut tensors, &config)
            .with_context(|| format!("reading the tensors of {}", dir.display()))?;
        if family.reads_fp8() && super::fp8::config_says_scaled_fp8(&config) {
            // The rewrite (mlx-lm's sanitize) folded the scales into float
            // weights, as its block size said.
            config.remove("quantization_config");
        }
        let mut source = Self {
            dir: dir.to_path_buf(),
            config,
            family,
            tensors,
            packed: BTreeMap::new(),
        };
        source.find_packed()?;
        Ok(source)
    }

    /// Recovers how each packed input layer is quantized (mlx-lm's
    /// `infer_quant_config`: bits and group size from the shapes).
    fn find_packed(&mut self) -> Result<()> {
        let prefixes: Vec<String> = self
            .tensors
            .keys()
            .filter_map(|n| n.strip_suffix(".scales").map(str::to_string))
            .collect();
        if prefixes.is_empty() {
            return Ok(());
        }
        let Some(block) = self.config.get("quantization") else {
            bail!(
                "{} has quantized tensors but its config.json has no quantization entry",
                self.dir.display()
            );
        };
        let quantization = Quantization::parse(block.clone(), "quantization")
            .with_context(|| format!("reading {}", self.dir.join("config.json").display()))?;
        for prefix in prefixes {
            for part in ["weight", "scales"] {
                if !self.tensors.contains_key(&format!("{prefix}.{part}")) {
                    bail!("{prefix}.{part} is missing");
                }
            }
            let spec = layer_quant_spec(&self.tensors, Some(&quantization), &prefix)?
                .with_context(|| format!("cannot tell how {prefix} is quantized"))?;
            self.packed.insert(
                prefix,
                LayerQuant {
                    mode: spec.mode,
                    group_size: spec.group_size,
                    bits: spec.bits,
                },
            );
        }
        Ok(())
    }

    /// Drops the input tensors of a written unit.
    fn release(&mut self, unit: &Unit) {
        match unit {
            Unit::Plain(name) => {
                self.tensors.remove(name);
            }
            Unit::Quantize(prefix, _) | Unit::Packed(prefix, _) => {
                for part in ["weight", "scales", "biases"] {
                    self.tensors.remove(&format!("{prefix}.{part}"));
                }
            }
        }
    }

    /// The dtype mlx-lm casts to: the flag, else config.json's `torch_dtype`.
    fn target_dtype(&self, flag: Option<Dtype>) -> Option<Dtype> {
        if flag.is_some() {
            return flag;
        }
        let named = self
            .config
            .get("torch_dtype")
            .or_else(|| self.config.get("text_config").and_then(|t| t.get("dtype")))
            .and_then(Value::as_str)?;
        match named {
            "float16" | "bfloat16" | "float32" => parse_dtype(named),
            _ => None,
        }
    }
}

fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false))
        && v.as_i64() != Some(0)
        && v.as_array().is_none_or(|a| !a.is_empty())
}

/// Decides, for each quantizable layer, how mlx-lm would quantize it.
struct Quantizer {
    recipe: QuantRecipe,
    group_size: i32,
    bits: i32,
    /// For the mixed recipes: where the layer number sits in a name, and how many layers.
    layout: Option<(usize, i64)>,
}

impl Quantizer {
    fn new(recipe: QuantRecipe, names: &[String], config: &Map<String, Value>) -> Result<Self> {
        let (group_size, bits) = recipe.resolved();
        let layout = match recipe.mixed {
            None => None,
            Some(_) => {
                let down = names
                    .iter()
                    .find(|n| n.contains("down_proj"))
                    .context("the model has no down_proj layers, which the mixed recipes need")?;
                let location = down
                    .split('.')
                    .position(|p| p.chars().all(|c| c.is_ascii_digit()))
                    .unwrap_or(down.split('.').count());
                let layers = config
                    .get("num_hidden_layers")
                    .or_else(|| config.get("text_config")?.get("num_hidden_layers"))
                    .and_then(Value::as_i64)
                    .context("config.json has no num_hidden_layers")?;
                Some((location, layers))
            }
        };
        Ok(Self {
            recipe,
            group_size,
            bits,
            layout,
        })
    }

    /// The quantization of layer `prefix` whose input dimension is `in_dims`;
    /// None keeps it dense. Also whether config.json names it on its own.
    fn layer(&self, prefix: &str, in_dims: i32) -> Option<(LayerQuant, bool)> {
        if in_dims % self.group_size != 0 {
            return None;
        }
        let (Some(mixed), Some((location, n))) = (self.recipe.mixed, self.layout) else {
            return Some((
                LayerQuant {
                    mode: self.recipe.mode,
                    group_size: self.group_size,
                    bits: self.bits,
                },
                false,
            ));
        };
        let parts: Vec<&str> = prefix.split('.').collect();
        let index: i64 = parts
            .get(location)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let more = index < n / 8 || index >= 7 * n / 8 || (index - n / 8).rem_euclid(3) == 2;
        let (low, high) = mixed.bits();
        let value = ["v_proj", "v_a_proj", "v_b_proj"]
            .iter()
            .any(|k| prefix.contains(k));
        let high_layer =
            ((value || prefix.contains("down_proj")) && more) || prefix.contains("lm_head");
        Some((
            LayerQuant {
                mode: QuantMode::Affine,
                group_size: self.recipe.group_size.unwrap_or(self.group_size),
                bits: if high_layer { high } else { low },
            },
            true,
        ))
    }
}

/// The plan: units in output order, the config's quantization entry.
struct Plan {
    units: Vec<Unit>,
    quantization: Option<Map<String, Value>>,
}

/// `overrides` None: the family's own predicate, as mlx-lm uses the model's
/// `quant_predicate` when the recipe names none.
fn plan(source: &Source, opts: &HfOptions, overrides: Option<&LayerOverrides>) -> Result<Plan> {
    let tied = source.family.tied(&Value::Object(source.config.clone()))?;
    let mut names: Vec<String> = source
        .tensors
        .keys()
        .filter(|n| source.family.keeps(n, tied))
        .cloned()
        .collect();
    names.sort_by_key(|n| natural_key(n));

    if let Some(recipe) = opts.quantize {
        if !source.packed.is_empty() {
            bail!(
                "{} is already quantized; -q would quantize it twice. Convert it with -d first, then quantize the dense copy",
                source.dir.display()
            );
        }
        let quantizer = Quantizer::new(recipe, &names, &source.config)?;
        let mut entry = Map::new();
        entry.insert("group_size".into(), json!(quantizer.group_size));
        entry.insert("bits".into(), json!(quantizer.bits));
        entry.insert("mode".into(), json!(recipe.mode.name()));
        let mut units = Vec::new();
        for name in names {
            let array = &source.tensors[&name];
            let prefix = name.strip_suffix(".weight");
            let layer = prefix
                .filter(|_| source.family.quantizable(&name, array.ndim()))
                .and_then(|p| {
                    let in_dims = *array.shape().last().unwrap_or(&0);
                    quantizer.layer(p, in_dims).map(|q| (p.to_string(), q))
                });
            match layer {
                Some((prefix, (q, named))) => {
                    // mlx-lm records a layer its predicate gave parameters
                    // as exactly those parameters (no mode).
                    let chosen = match overrides {
                        Some(o) => o.get(&prefix).copied(),
                        None if recipe.mixed.is_none() => source.family.predicate(&prefix),
                        None => None,
                    };
                    let q = match chosen {
                        Some((group_size, bits)) => {
                            entry.insert(
                                prefix.clone(),
                                json!({"bits": bits, "group_size": group_size}),
                            );
                            LayerQuant {
                                mode: QuantMode::Affine,
                                group_size,
                                bits,
                            }
                        }
                        None => {
                            if named {
                                entry.insert(prefix.clone(), q.json());
                            }
                            q
                        }
                    };
                    units.push(Unit::Quantize(prefix, q));
                }
                None => units.push(Unit::Plain(name)),
            }
        }
        return Ok(Plan {
            units,
            quantization: Some(entry),
        });
    }

    let mut units = Vec::new();
    for name in names {
        let packed = source
            .packed
            .iter()
            .find(|(p, _)| {
                name.strip_prefix(p.as_str())
                    .is_some_and(|s| [".weight", ".scales", ".biases"].contains(&s))
            })
            .map(|(p, q)| (p.clone(), *q));
        match packed {
            Some((prefix, q)) => {
                if name.ends_with(".weight") {
                    units.push(Unit::Packed(prefix, q));
                }
            }
            None => units.push(Unit::Plain(name)),
        }
    }
    let quantization = if opts.dequantize {
        None
    } else {
        source
            .config
            .get("quantization")
            .and_then(Value::as_object)
            .cloned()
    };
    Ok(Plan {
        units,
        quantization,
    })
}

fn cast(a: Array, dtype: Option<Dtype>) -> Result<Array> {
    match dtype {
        Some(d) if is_float(a.dtype()) && a.dtype() != d => Ok(a.as_dtype(d)?),
        _ => Ok(a),
    }
}

/// The tensors a unit writes, lazily computed, with the parameters they count.
fn unit_outputs(
    source: &Source,
    unit: &Unit,
    dtype: Option<Dtype>,
    dequantize: bool,
) -> Result<(Vec<(String, Array)>, u64)> {
    let get = |name: &str| {
        source
            .tensors
            .get(name)
            .cloned()
            .with_context(|| format!("tensor {name} is missing"))
    };
    Ok(match unit {
        Unit::Plain(name) => {
            let dtype = dtype.filter(|_| source.family.casts(name));
            let a = cast(get(name)?, dtype)?;
            let n = a.size() as u64;
            (vec![(name.clone(), a)], n)
        }
        Unit::Quantize(prefix, q) => {
            let w = cast(get(&format!("{prefix}.weight"))?, dtype)?;
            let n = w.size() as u64;
            let parts = quantize_with_mode(&w, q.group_size, q.bits, q.mode)
                .with_context(|| format!("quantizing {prefix}"))?;
            let names = ["weight", "scales", "biases"];
            let outs = parts
                .into_iter()
                .zip(names)
                .map(|(a, s)| (format!("{prefix}.{s}"), a))
                .collect();
            (outs, n)
        }
        Unit::Packed(prefix, q) => {
            let w = get(&format!("{prefix}.weight"))?;
            let scales = cast(get(&format!("{prefix}.scales"))?, dtype)?;
            let biases = match source.tensors.get(&format!("{prefix}.biases")) {
                Some(b) => Some(cast(b.clone(), dtype)?),
                None => None,
            };
            let n = (w.size() as u64) * 32 / q.bits as u64;
            if dequantize {
                let dense = dequantize_with_mode(
                    &w,
                    &scales,
                    biases.as_ref(),
                    q.group_size,
                    q.bits,
                    q.mode,
                )
                .with_context(|| format!("dequantizing {prefix}"))?;
                (vec![(format!("{prefix}.weight"), dense)], n)
            } else {
                let mut outs = vec![
                    (format!("{prefix}.weight"), w),
                    (format!("{prefix}.scales"), scales),
                ];
                if let Some(b) = biases {
                    outs.push((format!("{prefix}.biases"), b));
                }
                (outs, n)
            }
        }
    })
}

/// Affine `(group_size, bits)` by layer prefix, overriding the recipe for
/// those layers (dynamic quantization's high-precision layers).
pub type LayerOverrides = BTreeMap<String, (i32, i32)>;

/// Converts the model folder `dir` into `opts.output`.
pub fn convert(dir: &Path, opts: &HfOptions, report: &mut dyn FnMut(Event)) -> Result<HfSummary> {
    convert_layers(dir, opts, None, report)
}

/// `convert`, with some layers quantized as `overrides` says.
pub(crate) fn convert_with_overrides(
    dir: &Path,
    opts: &HfOptions,
    overrides: &LayerOverrides,
    report: &mut dyn FnMut(Event),
) -> Result<HfSummary> {
    convert_layers(dir, opts, Some(overrides), report)
}

fn convert_layers(
    dir: &Path,
    opts: &HfOptions,
    overrides: Option<&LayerOverrides>,
    report: &mut dyn FnMut(Event),
) -> Result<HfSummary> {
    if opts.dequantize && opts.quantize.is_some() {
        bail!("-d/--dequantize and -q/--quantize exclude each other");
    }
    if let Some(recipe) = &opts.quantize {
        recipe.validate()?;
    }
    output::require_absent(&opts.output)?;
    let mut source = Source::open(dir)?;
    let dtype = source.target_dtype(opts.dtype);
    let plan = plan(&source, opts, overrides)?;

    // Shapes and dtypes first (lazy graphs, nothing computed), for the headers.
    let mut infos = Vec::with_capacity(plan.units.len());
    let mut parameters = 0u64;
    let inner = inner_modules(&plan.units);
    for unit in &plan.units {
        let (outs, n) = unit_outputs(&source, unit, dtype, opts.dequantize)?;
        if !inner.contains(unit.module()) {
            parameters += n;
        }
        infos.push(
            outs.iter()
                .map(|(k, a)| TensorInfo::of(k, a))
                .collect::<Vec<_>>(),
        );
    }
    let total: u64 = infos.iter().flatten().map(TensorInfo::nbytes).sum();
    let count: usize = infos.iter().map(Vec::len).sum();
    report(Event::Start {
        tensors: count,
        bytes: total,
    });

    let staging = StagingDir::new(&opts.output)?;
    let shards = safetensors_out::plan_shards(&infos, safetensors_out::MAX_SHARD_BYTES);
    let mut weight_map = Vec::new();
    for (i, members) in shards.iter().enumerate() {
        let file = safetensors_out::shard_name(i, shards.len());
        let header: Vec<TensorInfo> = members.iter().flat_map(|&u| infos[u].clone()).collect();
        let mut writer = ShardWriter::create(&staging.path().join(&file), header)?;
        for &u in members {
            let (outs, _) = unit_outputs(&source, &plan.units[u], dtype, opts.dequantize)?;
            let arrays: Vec<&Array> = outs.iter().map(|(_, a)| a).collect();
            mlx_rs::transforms::eval(arrays)
                .map_err(mlx_error)
                .with_context(|| {
                    format!(
                        "computing {}",
                        outs.first().map(|o| o.0.as_str()).unwrap_or("?")
                    )
                })?;
            for (name, array) in &outs {
                writer.write(name, array)?;
                weight_map.push((name.clone(), file.clone()));
                report(Event::Wrote {
                    name,
                    bytes: array.nbytes() as u64,
                });
            }
            // The inputs now hold their data: let them go, and MLX's buffers too.
            drop(outs);
            source.release(&plan.units[u]);
            // SAFETY: a plain call into MLX's allocator, which is not in use elsewhere now.
            unsafe {
                mlx_sys::mlx_clear_cache();
            }
        }
        writer.finish()?;
    }
    output::write_json(
        staging.path(),
        "model.safetensors.index.json",
        &safetensors_out::index_json(&weight_map, total, parameters),
    )?;

    let mut config = source.config.clone();
    config.remove("_name_or_path");
    config.remove("vision_config");
    config.remove("quantization");
    config.remove("quantization_config");
    source.family.edit_config(&mut config);
    if let Some(q) = &plan.quantization {
        config.insert("quantization".into(), Value::Object(q.clone()));
        config.insert("quantization_config".into(), Value::Object(q.clone()));
    }
    if let Some(d) = opts.dtype {
        config.insert("torch_dtype".into(), json!(crate::mlx_ext::dtype_name(d)));
    }
    let mut sorted: Vec<(String, Value)> = config.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    output::write_json(
        staging.path(),
        "config.json",
        &Value::Object(sorted.into_iter().collect()),
    )?;
    copy_companions(&source.dir, staging.path())?;
    let card = super::card::model_card(&source.dir, opts.base_model.as_deref())?;
    std::fs::write(staging.path().join("README.md"), card)
        .with_context(|| format!("writing the model card in {}", staging.path().display()))?;

    let commit = staging.commit()?;
    Ok(HfSummary {
        output: opts.output.clone(),
        tensors: count,
        bytes: total,
        shards: shards.len(),
        parameters,
        bits_per_weight: if parameters == 0 {
            0.0
        } else {
            total as f64 * 8.0 / parameters as f64
        },
        quantization: plan.quantization.map(Value::Object),
        commit,
    })
}

/// Copies the tokenizer, generation config and code files as they are.
fn copy_companions(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let weights = name.ends_with(".safetensors")
            || name.ends_with(".bin")
            || name.ends_with(".pth")
            || name.ends_with(".gguf")
            || name.ends_with(".safetensors.index.json")
            || name.ends_with(".bin.index.json");
        let skip = weights
            || name == "config.json"
            || name == "README.md"
            || name.starts_with("adapter")
            || name.starts_with('.');
        if path.is_file() && !skip {
            std::fs::copy(&path, to.join(&name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}
