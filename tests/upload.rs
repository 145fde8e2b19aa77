//! `mlx-bun upload` (and `convert --upload-repo`) against a small server
//! speaking the Hub's upload protocol on loopback: repo creation, preupload,
//! the LFS batch API (whole-file and multipart transfers, verify), and the
//! NDJSON commit. The server checks the token, records what it received, and
//! drops the first upload connection to prove the client resumes.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::{Json, Router};
use base64::Engine;
use common::hub::{self, sha256_hex};
use common::{bin, model_dir, oracle_python, repo_root};
use serde_json::{json, Value};

const TOKEN: &str = "hf_test_token";
/// LFS objects larger than this go through the multipart transfer.
const MULTIPART_OVER: usize = 64 * 1024;
const CHUNK: usize = 32 * 1024;

#[derive(Default)]
struct Hub {
    base: String,
    repos: HashSet<String>,
    private: HashMap<String, bool>,
    /// LFS objects by sha256.
    objects: HashMap<String, Vec<u8>>,
    parts: HashMap<(String, usize), Vec<u8>>,
    /// Each commit: repo and its NDJSON lines.
    commits: Vec<(String, Vec<Value>)>,
    uploads: usize,
    unauthorized: usize,
}

#[derive(Clone)]
struct App {
    hub: Arc<Mutex<Hub>>,
    /// Files served for download (tests/common/hub.rs).
    served: hub::Served,
    drop_next_upload: Arc<AtomicBool>,
}

fn authorized(app: &App, headers: &HeaderMap) -> bool {
    let ok = headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !ok {
        app.hub.lock().unwrap().unauthorized += 1;
    }
    ok
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "Invalid credentials in Authorization header"})),
    )
        .into_response()
}

async fn create(State(app): State<App>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if !authorized(&app, &headers) {
        return unauthorized();
    }
    let repo = format!(
        "{}/{}",
        body["organization"].as_str().unwrap_or("me"),
        body["name"].as_str().unwrap()
    );
    let mut hub = app.hub.lock().unwrap();
    if !hub.repos.insert(repo.clone()) {
        return (
            StatusCode::CONFLICT,
            Json(json!({"error": "You already created this model repo"})),
        )
            .into_response();
    }
    hub.private
        .insert(repo.clone(), body["private"].as_bool().unwrap_or(false));
    let url = format!("{}/{repo}", hub.base);
    Json(json!({"url": url})).into_response()
}

async fn preupload(
    State(app): State<App>,
    headers: HeaderMap,
    UrlPath((_org, _name, _rev)): UrlPath<(String, String, String)>,
    Json(body): Json<Value>,
) -> Response {
    if !authorized(&app, &headers) {
        return unauthorized();
    }
    let files: Vec<Value> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap();
            let sample = base64::engine::general_purpose::STANDARD
                .decode(f["sample"].as_str().unwrap())
                .unwrap();
            assert!(sample.len() <= 512);
            let lfs = path.ends_with(".safetensors") || f["size"].as_u64().unwrap() > 10_000;
            json!({"path": path, "uploadMode": if lfs {"lfs"} else {"regular"}, "shouldIgnore": false})
        })
        .collect();
    Json(json!({"files": files})).into_response()
}

async fn batch(
    State(app): State<App>,
    headers: HeaderMap,
    UrlPath((_org, name_git)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    if !authorized(&app, &headers) {
        return unauthorized();
    }
    assert!(name_git.ends_with(".git"));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["operation"], "upload");
    let hub = app.hub.lock().unwrap();
    let objects: Vec<Value> = body["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let oid = o["oid"].as_str().unwrap();
            let size = o["size"].as_u64().unwrap() as usize;
            if hub.objects.contains_key(oid) {
                return json!({"oid": oid, "size": size});
            }
            let verify = json!({"href": format!("{}/lfs-verify", hub.base)});
            let upload = if size > MULTIPART_OVER {
                let mut header = serde_json::Map::new();
                header.insert("chunk_size".into(), json!(CHUNK.to_string()));
                for part in 1..=size.div_ceil(CHUNK) {
                    header.insert(format!("{part:05}"), json!(format!("{}/lfs-part/{oid}/{part}", hub.base)));
                }
                json!({"href": format!("{}/lfs-complete/{oid}", hub.base), "header": header})
            } else {
                json!({"href": format!("{}/lfs-upload/{oid}", hub.base), "header": {"x-upload-key": "k"}})
            };
            json!({"oid": oid, "size": size, "actions": {"upload": upload, "verify": verify}})
        })
        .collect();
    (
        [("content-type", "application/vnd.git-lfs+json")],
        Json(json!({"transfer": "basic", "objects": objects})),
    )
        .into_response()
}

/// The first upload request of a server loses its connection mid-way.
fn maybe_drop(app: &App) {
    if app.drop_next_upload.swap(false, Ordering::SeqCst) {
        panic!("the test hub drops this connection on purpose");
    }
}

async fn upload(
    State(app): State<App>,
    headers: HeaderMap,
    UrlPath(oid): UrlPath<String>,
    body: Bytes,
) -> Response {
    maybe_drop(&app);
    assert_eq!(
        headers.get("x-upload-key").and_then(|v| v.to_str().ok()),
        Some("k")
    );
    assert_eq!(
        sha256_hex(&body),
        oid,
        "uploaded bytes do not hash to their oid"
    );
    let mut hub = app.hub.lock().unwrap();
    hub.uploads += 1;
    hub.objects.insert(oid, body.to_vec());
    StatusCode::OK.into_response()
}

async fn part(
    State(app): State<App>,
    UrlPath((oid, n)): UrlPath<(String, usize)>,
    body: Bytes,
) -> Response {
    maybe_drop(&app);
    assert!(body.len() <= CHUNK);
    let mut hub = app.hub.lock().unwrap();
    hub.uploads += 1;
    let etag = format!("\"etag-{n}-{}\"", body.len());
    hub.parts.insert((oid, n), body.to_vec());
    ([("etag", etag)], "").into_response()
}

async fn complete(
    State(app): State<App>,
    UrlPath(oid): UrlPath<String>,
    Json(body): Json<Value>,
) -> Response {
    let mut hub = app.hub.lock().unwrap();
    let mut data = Vec::new();
    for (i, p) in body["parts"].as_array().unwrap().iter().enumerate() {
        let n = p["partNumber"].as_u64().unwrap() as usize;
        assert_eq!(n, i + 1);
        let chunk = hub
            .parts
            .remove(&(oid.clone(), n))
            .expect("a completed part was uploaded");
        assert_eq!(p["etag"], format!("\"etag-{n}-{}\"", chunk.len()));
        data.extend(chunk);
    }
    assert_eq!(sha256_hex(&data), oid);
    hub.objects.insert(oid, data);
    StatusCode::OK.into_response()
}

async fn verify(State(app): State<App>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if !authorized(&app, &headers) {
        return unauthorized();
    }
    let hub = app.hub.lock().unwrap();
    match hub.objects.get(body["oid"].as_str().unwrap()) {
        Some(d) if d.len() as u64 == body["size"].as_u64().unwrap() => {
            StatusCode::OK.into_response()
        }
        _ => (StatusCode::NOT_FOUND, "object missing").into_response(),
    }
}

async fn commit(
    State(app): State<App>,
    headers: HeaderMap,
    UrlPath((org, name, rev)): UrlPath<(String, String, String)>,
    body: String,
) -> Response {
    if !authorized(&app, &headers) {
        return unauthorized();
    }
    assert_eq!(rev, "main");
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/x-ndjson")
    );
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut hub = app.hub.lock().unwrap();
    let missing = lines.iter().any(|l| {
        l["key"] == "lfsFile"
            && !hub
                .objects
                .contains_key(l["value"]["oid"].as_str().unwrap())
    });
    if missing {
        return (StatusCode::UNPROCESSABLE_ENTITY, "LFS object missing").into_response();
    }
    hub.commits.push((format!("{org}/{name}"), lines));
    Json(json!({"commitOid": "c0ffee", "commitUrl": format!("{}/{org}/{name}/commit/c0ffee", hub.base)})).into_response()
}

/// Starts the hub on a loopback port; returns its state and address.
fn start_hub() -> (App, String) {
    let app = App {
        hub: Arc::new(Mutex::new(Hub::default())),
        served: hub::Served::default(),
        drop_next_upload: Arc::new(AtomicBool::new(true)),
    };
    let router = Router::new()
        .route("/api/repos/create", post(create))
        .route("/api/models/{org}/{name}/preupload/{rev}", post(preupload))
        .route("/api/models/{org}/{name}/commit/{rev}", post(commit))
        .route("/{org}/{name}/info/lfs/objects/batch", post(batch))
        .route("/lfs-upload/{oid}", put(upload))
        .route("/lfs-part/{oid}/{n}", put(part))
        .route("/lfs-complete/{oid}", post(complete))
        .route("/lfs-verify", post(verify))
        .with_state(app.clone())
        .merge(hub::download_router(
            app.served.clone(),
            hub::Log::default(),
        ));
    let base = hub::serve(router);
    app.hub.lock().unwrap().base = base.clone();
    (app, base)
}

fn upload_cmd(base: &str, token: &str, home: &Path) -> std::process::Command {
    let mut cmd = bin();
    cmd.env("HF_ENDPOINT", base)
        .env("HF_TOKEN", token)
        .env("HF_HOME", home)
        .env_remove("HF_TOKEN_PATH");
    cmd
}

/// A model-like folder: two weight shards (one multipart-sized), config, tokenizer.
fn model_folder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let bytes = |n: usize, seed: u32| -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
            .collect()
    };
    std::fs::write(
        dir.join("model-00001-of-00002.safetensors"),
        bytes(150_000, 1),
    )
    .unwrap();
    std::fs::write(
        dir.join("model-00002-of-00002.safetensors"),
        bytes(20_000, 2),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "llama", "quantization": {"group_size": 64, "bits": 4, "mode": "affine"}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "</s>"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("README.md"),
        "---\nlibrary_name: mlx\ntags:\n- mlx\nbase_model: org/base\n---\n",
    )
    .unwrap();
}

fn committed_files(lines: &[Value]) -> HashMap<String, Value> {
    lines
        .iter()
        .filter(|l| l["key"] == "file" || l["key"] == "lfsFile")
        .map(|l| (l["value"]["path"].as_str().unwrap().to_string(), l.clone()))
        .collect()
}

#[test]
fn upload_sends_every_file_resumes_a_dropped_connection_and_skips_what_the_hub_has() {
    let (app, base) = start_hub();
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    model_folder(&model);

    let out = upload_cmd(&base, TOKEN, tmp.path())
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "me/tiny",
            "--private",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "upload failed: {stderr}");
    assert!(
        stderr.contains("retrying"),
        "the dropped connection was not retried: {stderr}"
    );
    assert!(
        !app.drop_next_upload.load(Ordering::SeqCst),
        "no connection was dropped"
    );

    let hub = app.hub.lock().unwrap();
    assert!(hub.repos.contains("me/tiny") && hub.private["me/tiny"]);
    assert_eq!(hub.commits.len(), 1);
    let (repo, lines) = &hub.commits[0];
    assert_eq!(repo, "me/tiny");
    assert_eq!(lines[0]["key"], "header");
    let files = committed_files(lines);
    let mut names: Vec<_> = files.keys().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "README.md",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "tokenizer_config.json"
        ]
    );
    for name in &names {
        let local = std::fs::read(model.join(name)).unwrap();
        let entry = &files[name];
        let received = if entry["key"] == "lfsFile" {
            assert_eq!(entry["value"]["algo"], "sha256");
            hub.objects[entry["value"]["oid"].as_str().unwrap()].clone()
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(entry["value"]["content"].as_str().unwrap())
                .unwrap()
        };
        assert_eq!(received, local, "{name} arrived changed");
    }
    assert_eq!(files["model-00001-of-00002.safetensors"]["key"], "lfsFile");
    assert_eq!(files["config.json"]["key"], "file");
    // The card names the repo, where it came from and how it is quantized.
    let card = std::fs::read_to_string(model.join("README.md")).unwrap();
    assert!(
        card.starts_with("---\n") && card.contains("library_name: mlx"),
        "{card}"
    );
    assert!(
        card.contains("# me/tiny")
            && card.contains("org/base")
            && card.contains("4 bits, group size 64"),
        "{card}"
    );
    assert!(card.contains(&format!("{base}/me/tiny")), "{card}");
    let uploads = hub.uploads;
    drop(hub);

    // A second run (as after an interrupted one) finds the objects there and sends none.
    let out = upload_cmd(&base, TOKEN, tmp.path())
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "me/tiny",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "second upload failed: {stderr}");
    assert!(
        stderr.contains("2 already there") && stderr.contains("0.0 MB sent"),
        "{stderr}"
    );
    let hub = app.hub.lock().unwrap();
    assert_eq!(hub.uploads, uploads, "objects were uploaded twice");
    assert_eq!(hub.commits.len(), 2);
}

#[test]
fn a_wrong_or_missing_token_gives_a_clear_error() {
    let (app, base) = start_hub();
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    model_folder(&model);
    let out = upload_cmd(&base, "wrong", tmp.path())
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "me/tiny",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refused the token") && stderr.contains("401"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"));
    assert!(app.hub.lock().unwrap().commits.is_empty());

    // The token file is read when HF_TOKEN is not set.
    std::fs::write(tmp.path().join("token"), format!("{TOKEN}\n")).unwrap();
    let out = upload_cmd(&base, "", tmp.path())
        .env_remove("HF_TOKEN")
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "me/file-token",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::remove_file(tmp.path().join("token")).unwrap();
    let out = upload_cmd(&base, "", tmp.path())
        .env_remove("HF_TOKEN")
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "me/tiny",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no Hugging Face token"),
        "{stderr}"
    );
    let out = upload_cmd(&base, TOKEN, tmp.path())
        .args([
            "upload",
            "--path",
            model.to_str().unwrap(),
            "--upload-repo",
            "not a repo",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a Hub repo id"));
}

#[test]
fn convert_upload_repo_uploads_the_converted_model() {
    let (app, base) = start_hub();
    let tmp = tempfile::tempdir().unwrap();
    let py = oracle_python().expect("the oracle is required");
    let status = std::process::Command::new(py)
        .arg(repo_root().join("scripts/oracle/make_tiny_hf.py"))
        .arg(tmp.path().join("hf"))
        .arg(model_dir())
        .env("HF_HUB_OFFLINE", "1")
        .status()
        .unwrap();
    assert!(status.success());
    let out_dir = tmp.path().join("q4");
    let out = upload_cmd(&base, TOKEN, tmp.path())
        .args([
            "convert",
            "--hf-path",
            tmp.path().join("hf/qwen3").to_str().unwrap(),
            "--mlx-path",
            out_dir.to_str().unwrap(),
            "-q",
            "--upload-repo",
            "me/qwen3-4bit",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hub = app.hub.lock().unwrap();
    let (repo, lines) = &hub.commits[0];
    assert_eq!(repo, "me/qwen3-4bit");
    let files = committed_files(lines);
    for f in [
        "model.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "README.md",
        "tokenizer.json",
    ] {
        assert!(
            files.contains_key(f),
            "{f} was not uploaded: {:?}",
            files.keys()
        );
    }
    let local = std::fs::read(out_dir.join("model.safetensors")).unwrap();
    let oid = files["model.safetensors"]["value"]["oid"].as_str().unwrap();
    assert_eq!(hub.objects[oid], local);
}

#[test]
fn convert_downloads_a_hub_repo_through_hf_endpoint() {
    let (app, base) = start_hub();
    let tmp = tempfile::tempdir().unwrap();
    let py = oracle_python().expect("the oracle is required");
    let status = std::process::Command::new(py)
        .arg(repo_root().join("scripts/oracle/make_tiny_hf.py"))
        .arg(tmp.path().join("hf"))
        .arg(model_dir())
        .env("HF_HUB_OFFLINE", "1")
        .status()
        .unwrap();
    assert!(status.success());
    let local = tmp.path().join("hf/llama");
    let mut files = HashMap::new();
    for entry in std::fs::read_dir(&local).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        files.insert(name, std::fs::read(&path).unwrap());
    }
    files.insert(
        "README.md".into(),
        b"---\nlicense: apache-2.0\ntags:\n- text-generation\n---\n# Tiny\n".to_vec(),
    );
    app.served
        .lock()
        .unwrap()
        .insert("org/tiny-llama".into(), files);

    let home = tmp.path().join("hf-home");
    let from_hub = tmp.path().join("from-hub");
    let out = upload_cmd(&base, TOKEN, &home)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .args([
            "convert",
            "--hf-path",
            "org/tiny-llama",
            "--mlx-path",
            from_hub.to_str().unwrap(),
            "-q",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_disk = tmp.path().join("from-disk");
    let out = bin()
        .args([
            "convert",
            "--hf-path",
            local.to_str().unwrap(),
            "--mlx-path",
            from_disk.to_str().unwrap(),
            "-q",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        std::fs::read(from_hub.join("model.safetensors")).unwrap(),
        std::fs::read(from_disk.join("model.safetensors")).unwrap(),
        "the downloaded checkpoint converts to other bytes than the local one"
    );
    // The card keeps the Hub card's metadata and names the source repo.
    let card = std::fs::read_to_string(from_hub.join("README.md")).unwrap();
    assert!(
        card.contains("base_model: org/tiny-llama") && card.contains("license: apache-2.0"),
        "{card}"
    );
    assert!(
        card.contains("- text-generation") && card.contains("- mlx"),
        "{card}"
    );

    // The download sits in the Hub cache, where manage finds it.
    let scan = bin()
        .args(["manage", "--scan", "--pattern", "tiny"])
        .env("HF_HOME", &home)
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&scan.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("org/tiny-llama ")),
        "{text}"
    );
}
