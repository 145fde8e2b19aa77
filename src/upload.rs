//! Uploading a model folder to a Hugging Face Hub repository over the Hub's
//! HTTP protocol (`mlx-bun upload`, `convert --upload-repo`,
//! `train fuse --upload-repo`): create the repo, ask which files go through
//! LFS (`preupload`), upload those through the LFS batch API (whole-file or
//! multipart), then commit every file in one NDJSON commit.
//!
//! It resumes: every request is retried after a dropped connection or a
//! server error, and objects the Hub already holds (an earlier, interrupted
//! run) come back from the LFS batch without an upload action and are skipped.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Files at most this large are committed inline (as the Hub's own limit for
/// non-LFS files suggests, the server's `preupload` answer decides).
const SAMPLE_BYTES: usize = 512;
const ATTEMPTS: u32 = 5;

/// What the uploader reports; the CLI draws it.
pub enum UploadEvent<'a> {
    /// Hashing done: this many bytes in this many files will be sent.
    Start {
        /// Files to send.
        files: usize,
        /// Their total size in bytes.
        bytes: u64,
    },
    /// Bytes of `path` went out (or were already on the Hub).
    Sent {
        /// The file's path in the repository.
        path: &'a str,
        /// Bytes sent (or found on the Hub) in this step.
        bytes: u64,
    },
    /// A request failed and is tried again.
    Retry {
        /// The request that failed.
        what: &'a str,
        /// Why it failed.
        error: String,
    },
}

/// Where and as whom.
#[derive(Clone, Debug)]
pub struct Hub {
    /// The Hub's base URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub endpoint: String,
    /// The access token sent as a bearer token.
    pub token: String,
}

impl Hub {
    /// `HF_ENDPOINT` (else the public Hub) and the token from `HF_TOKEN` or
    /// the Hub's token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`).
    pub fn from_env() -> Result<Self> {
        let endpoint = crate::hub::endpoint()?;
        let token = crate::hub::token().context(
            "no Hugging Face token: set HF_TOKEN or log in so that the Hub's token file exists",
        )?;
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        })
    }
}

/// One file of the folder, hashed.
struct LocalFile {
    path: PathBuf,
    /// Its path in the repo (`/`-separated).
    name: String,
    size: u64,
    sha256: String,
    sample: Vec<u8>,
}

/// What an upload did.
#[derive(Debug)]
pub struct UploadSummary {
    /// The repository's URL on the Hub.
    pub repo_url: String,
    /// Files in the commit.
    pub files: usize,
    /// Files stored through LFS.
    pub lfs_files: usize,
    /// LFS objects the Hub already had (skipped).
    pub lfs_skipped: usize,
    /// Bytes of LFS objects uploaded.
    pub bytes_sent: u64,
    /// The commit's id, when the Hub returned one.
    pub commit: Option<String>,
}

fn sha256_file(path: &Path) -> Result<(String, Vec<u8>, u64)> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    let mut sample = Vec::new();
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        if sample.len() < SAMPLE_BYTES {
            let take = (SAMPLE_BYTES - sample.len()).min(n);
            sample.extend_from_slice(&buf[..take]);
        }
        ctx.update(&buf[..n]);
        size += n as u64;
    }
    let hex: String = ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((hex, sample, size))
}

fn list_files(dir: &Path) -> Result<Vec<LocalFile>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            if rel
                .components()
                .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
            {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file() {
                let name = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let (sha256, sample, size) = sha256_file(&path)?;
                out.push(LocalFile {
                    path,
                    name,
                    size,
                    sha256,
                    sample,
                });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The Hub's error text: its JSON `error` field, else the body.
fn error_text(resp: Response) -> String {
    let status = resp.status();
    let body = resp.text().unwrap_or_default();
    let detail = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
        .unwrap_or(body);
    format!("{status}: {}", detail.trim())
}

struct Session<'a> {
    hub: &'a Hub,
    client: Client,
    report: &'a mut dyn FnMut(UploadEvent),
}

impl Session<'_> {
    /// Sends a request, retrying dropped connections and 5xx answers; 401 and
    /// 403 end it with a clear message.
    fn send(
        &mut self,
        what: &str,
        build: &dyn Fn(&Client) -> Result<RequestBuilder>,
    ) -> Result<Response> {
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                (self.report)(UploadEvent::Retry {
                    what,
                    error: last.clone(),
                });
                std::thread::sleep(Duration::from_millis(200 * (1 << attempt)));
            }
            match build(&self.client)?.send() {
                Ok(resp) if resp.status().is_server_error() => last = error_text(resp),
                Ok(resp)
                    if resp.status() == StatusCode::UNAUTHORIZED
                        || resp.status() == StatusCode::FORBIDDEN =>
                {
                    bail!(
                        "{what}: the Hub at {} refused the token ({}); check HF_TOKEN or the token file and the repo's permissions",
                        self.hub.endpoint,
                        error_text(resp)
                    );
                }
                Ok(resp) => return Ok(resp),
                Err(e) => last = format!("{e:#}"),
            }
        }
        bail!("{what} failed after {ATTEMPTS} attempts: {last}")
    }

    fn create_repo(&mut self, repo: &str, private: bool) -> Result<String> {
        let token = self.hub.token.clone();
        let (org, name) = match repo.split_once('/') {
            Some((o, n)) => (Some(o.to_string()), n.to_string()),
            None => (None, repo.to_string()),
        };
        let url = format!("{}/api/repos/create", self.hub.endpoint);
        let body = json!({"name": name, "organization": org, "private": private, "type": "model"});
        let resp = self.send("creating the repo", &|c| {
            Ok(c.post(&url).bearer_auth(&token).json(&body))
        })?;
        match resp.status() {
            s if s.is_success() => {
                let v: Value = resp.json().unwrap_or(Value::Null);
                Ok(v["url"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{}/{repo}", self.hub.endpoint)))
            }
            StatusCode::CONFLICT => Ok(format!("{}/{repo}", self.hub.endpoint)),
            _ => bail!("creating the repo {repo}: {}", error_text(resp)),
        }
    }

    /// Which files the Hub wants through LFS.
    fn preupload(&mut self, repo: &str, files: &[LocalFile]) -> Result<Vec<bool>> {
        let token = self.hub.token.clone();
        let url = format!("{}/api/models/{repo}/preupload/main", self.hub.endpoint);
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut modes = Vec::with_capacity(files.len());
        for chunk in files.chunks(250) {
            let body = json!({"files": chunk.iter().map(|f| json!({
                "path": f.name, "size": f.size, "sample": b64.encode(&f.sample)
            })).collect::<Vec<_>>()});
            let resp = self.send("asking the Hub how to upload", &|c| {
                Ok(c.post(&url).bearer_auth(&token).json(&body))
            })?;
            if !resp.status().is_success() {
                bail!("preupload for {repo}: {}", error_text(resp));
            }
            let v: Value = resp.json().context("reading the preupload answer")?;
            let answer = v["files"]
                .as_array()
                .context("the preupload answer has no files")?;
            for f in chunk {
                let entry = answer
                    .iter()
                    .find(|e| e["path"].as_str() == Some(f.name.as_str()))
                    .with_context(|| format!("the preupload answer does not mention {}", f.name))?;
                modes.push(entry["uploadMode"].as_str() == Some("lfs"));
            }
        }
        Ok(modes)
    }

    /// Uploads the LFS objects the Hub lacks. Returns (skipped, bytes sent).
    fn upload_lfs(&mut self, repo: &str, files: &[&LocalFile]) -> Result<(usize, u64)> {
        let token = self.hub.token.clone();
        if files.is_empty() {
            return Ok((0, 0));
        }
        let url = format!("{}/{repo}.git/info/lfs/objects/batch", self.hub.endpoint);
        let body = json!({
            "operation": "upload",
            "transfers": ["basic", "multipart"],
            "hash_algo": "sha256",
            "ref": {"name": "main"},
            "objects": files.iter().map(|f| json!({"oid": f.sha256, "size": f.size})).collect::<Vec<_>>(),
        });
        let resp = self.send("the LFS batch request", &|c| {
            Ok(c.post(&url)
                .bearer_auth(&token)
                .header("Accept", "application/vnd.git-lfs+json")
                .header("Content-Type", "application/vnd.git-lfs+json")
                .body(serde_json::to_vec(&body)?))
        })?;
        if !resp.status().is_success() {
            bail!("LFS batch for {repo}: {}", error_text(resp));
        }
        let answer: Value = resp.json().context("reading the LFS batch answer")?;
        let objects = answer["objects"]
            .as_array()
            .context("the LFS batch answer has no objects")?;
        let (mut skipped, mut sent) = (0, 0);
        for file in files {
            let obj = objects
                .iter()
                .find(|o| o["oid"].as_str() == Some(file.sha256.as_str()))
                .with_context(|| format!("the LFS batch answer does not mention {}", file.name))?;
            if let Some(err) = obj.get("error") {
                bail!(
                    "the Hub refused {}: {}",
                    file.name,
                    err["message"].as_str().unwrap_or("no reason given")
                );
            }
            let Some(upload) = obj.pointer("/actions/upload") else {
                skipped += 1;
                (self.report)(UploadEvent::Sent {
                    path: &file.name,
                    bytes: file.size,
                });
                continue;
            };
            let header = upload["header"].as_object().cloned().unwrap_or_default();
            if header.contains_key("chunk_size") {
                self.multipart(file, upload, &header)?;
            } else {
                let href = upload["href"]
                    .as_str()
                    .context("an LFS upload action has no href")?
                    .to_string();
                self.put_range(file, &href, &header, 0, file.size)?;
            }
            sent += file.size;
            if let Some(verify) = obj.pointer("/actions/verify") {
                let href = verify["href"]
                    .as_str()
                    .context("an LFS verify action has no href")?
                    .to_string();
                let check = json!({"oid": file.sha256, "size": file.size});
                let resp = self.send("verifying an LFS upload", &|c| {
                    Ok(c.post(&href).bearer_auth(&token).json(&check))
                })?;
                if !resp.status().is_success() {
                    bail!("verifying {}: {}", file.name, error_text(resp));
                }
            }
        }
        Ok((skipped, sent))
    }

    /// PUTs bytes `[start, start + len)` of `file`; returns the ETag.
    fn put_range(
        &mut self,
        file: &LocalFile,
        href: &str,
        header: &serde_json::Map<String, Value>,
        start: u64,
        len: u64,
    ) -> Result<Option<String>> {
        let what = format!("uploading {}", file.name);
        let path = file.path.clone();
        let name = file.name.clone();
        let resp = self.send(&what, &|c| {
            let mut f = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            f.seek(SeekFrom::Start(start))?;
            let body = reqwest::blocking::Body::sized(f.take(len), len);
            let mut req = c.put(href).body(body);
            for (k, v) in header {
                if let Some(v) = v.as_str() {
                    if k != "chunk_size" {
                        req = req.header(k.as_str(), v);
                    }
                }
            }
            Ok(req)
        })?;
        if !resp.status().is_success() {
            bail!("uploading {name}: {}", error_text(resp));
        }
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (self.report)(UploadEvent::Sent {
            path: &file.name,
            bytes: len,
        });
        Ok(etag)
    }

    /// The multipart transfer: numbered part URLs in the header, then a
    /// completion request listing each part's ETag.
    fn multipart(
        &mut self,
        file: &LocalFile,
        upload: &Value,
        header: &serde_json::Map<String, Value>,
    ) -> Result<()> {
        let chunk: u64 = header["chunk_size"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| header["chunk_size"].as_u64())
            .context("an LFS multipart action has a bad chunk_size")?;
        let mut parts: Vec<(u64, String)> = header
            .iter()
            .filter_map(|(k, v)| Some((k.parse::<u64>().ok()?, v.as_str()?.to_string())))
            .collect();
        parts.sort();
        let mut etags = Vec::new();
        for (number, url) in &parts {
            let start = (number - 1) * chunk;
            let len = chunk.min(file.size.saturating_sub(start));
            let etag = self
                .put_range(file, url, &serde_json::Map::new(), start, len)?
                .with_context(|| {
                    format!("part {number} of {} came back without an ETag", file.name)
                })?;
            etags.push(json!({"partNumber": number, "etag": etag}));
        }
        let href = upload["href"]
            .as_str()
            .context("an LFS multipart action has no completion href")?
            .to_string();
        let done = json!({"oid": file.sha256, "parts": etags});
        let resp = self.send("completing a multipart upload", &|c| {
            Ok(c.post(&href).json(&done))
        })?;
        if !resp.status().is_success() {
            bail!(
                "completing the upload of {}: {}",
                file.name,
                error_text(resp)
            );
        }
        Ok(())
    }

    fn commit(
        &mut self,
        repo: &str,
        files: &[LocalFile],
        lfs: &[bool],
        message: &str,
    ) -> Result<Option<String>> {
        let token = self.hub.token.clone();
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut lines =
            vec![json!({"key": "header", "value": {"summary": message, "description": ""}})];
        for (f, &is_lfs) in files.iter().zip(lfs) {
            if is_lfs {
                lines.push(json!({"key": "lfsFile", "value": {"path": f.name, "algo": "sha256", "oid": f.sha256, "size": f.size}}));
            } else {
                let content = std::fs::read(&f.path)
                    .with_context(|| format!("reading {}", f.path.display()))?;
                lines.push(json!({"key": "file", "value": {"path": f.name, "encoding": "base64", "content": b64.encode(content)}}));
            }
        }
        let mut body = String::new();
        for l in &lines {
            body.push_str(&l.to_string());
            body.push('\n');
        }
        let url = format!("{}/api/models/{repo}/commit/main", self.hub.endpoint);
        let resp = self.send("the commit", &|c| {
            Ok(c.post(&url)
                .bearer_auth(&token)
                .header("Content-Type", "application/x-ndjson")
                .body(body.clone()))
        })?;
        if !resp.status().is_success() {
            bail!("committing to {repo}: {}", error_text(resp));
        }
        let v: Value = resp.json().unwrap_or(Value::Null);
        Ok(v["commitOid"].as_str().map(str::to_string))
    }
}

/// Checks `user/name`.
pub fn validate_repo_id(repo: &str) -> Result<()> {
    let ok = repo.split('/').count() == 2
        && repo.split('/').all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
    if !ok {
        bail!("--upload-repo {repo:?} is not a Hub repo id (user/name)");
    }
    Ok(())
}

/// Uploads every file under `dir` (hidden ones excepted) to `repo` in one commit.
pub fn upload_folder(
    hub: &Hub,
    dir: &Path,
    repo: &str,
    private: bool,
    report: &mut dyn FnMut(UploadEvent),
) -> Result<UploadSummary> {
    validate_repo_id(repo)?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let files = list_files(dir)?;
    if files.is_empty() {
        bail!("{} has no files to upload", dir.display());
    }
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .timeout(None)
        .build()
        .map_err(|e| anyhow!("setting up the HTTP client: {e}"))?;
    let mut session = Session {
        hub,
        client,
        report,
    };
    let total: u64 = files.iter().map(|f| f.size).sum();
    (session.report)(UploadEvent::Start {
        files: files.len(),
        bytes: total,
    });
    let repo_url = session.create_repo(repo, private)?;
    let lfs = session.preupload(repo, &files)?;
    let lfs_files: Vec<&LocalFile> = files
        .iter()
        .zip(&lfs)
        .filter(|(_, &l)| l)
        .map(|(f, _)| f)
        .collect();
    let (lfs_skipped, bytes_sent) = session.upload_lfs(repo, &lfs_files)?;
    for (f, &l) in files.iter().zip(&lfs) {
        if !l {
            (session.report)(UploadEvent::Sent {
                path: &f.name,
                bytes: f.size,
            });
        }
    }
    let commit = session.commit(repo, &files, &lfs, "Upload with mlx-bun")?;
    Ok(UploadSummary {
        repo_url,
        files: files.len(),
        lfs_files: lfs_files.len(),
        lfs_skipped,
        bytes_sent,
        commit,
    })
}

/// Writes the body of the model card in `dir` (as mlx-lm's upload does):
/// where the model came from, how it was converted, and how to use it.
pub fn fill_model_card(dir: &Path, repo: &str, endpoint: &str) -> Result<()> {
    use crate::convert::card;
    let path = dir.join("README.md");
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    let mut meta = card::metadata(&existing)?;
    meta.insert("library_name".into(), "mlx".into());
    let base = meta
        .get("base_model")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let config: Value = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut body = format!("# {repo}\n\n");
    if let Some(base) = &base {
        body += &format!(
            "This model [{repo}]({endpoint}/{repo}) was converted to MLX format from \
             [{base}]({endpoint}/{base}) using mlx-bun version **{}**.\n\n",
            env!("CARGO_PKG_VERSION")
        );
    }
    let arch = config["model_type"].as_str().unwrap_or("unknown");
    let quantization = config.get("quantization").map(|q| {
        crate::quant::Quantization::parse(q.clone(), "quantization")
            .with_context(|| format!("reading the quantization of {}", dir.display()))
    });
    let weights = match quantization.transpose()? {
        Some(q) => format!(
            "quantized: {} bits, group size {}, mode {}",
            q.default.bits,
            q.default.group_size,
            q.default.mode.name()
        ),
        None => format!(
            "not quantized ({})",
            config["torch_dtype"].as_str().unwrap_or("float")
        ),
    };
    body += &format!("Architecture: `{arch}`; weights {weights}.\n\n");
    body += &format!(
        "## Use with mlx\n\n```bash\npip install mlx-lm\n```\n\n```python\nfrom mlx_lm import load, generate\n\n\
         model, tokenizer = load(\"{repo}\")\n\nprompt = \"hello\"\n\n\
         if tokenizer.chat_template is not None:\n    messages = [{{\"role\": \"user\", \"content\": prompt}}]\n    \
         prompt = tokenizer.apply_chat_template(\n        messages, add_generation_prompt=True, return_dict=False,\n    )\n\n\
         response = generate(model, tokenizer, prompt=prompt, verbose=True)\n```\n\n\
         Or with mlx-bun:\n\n```bash\nmlx-bun generate --model {repo} --prompt hello\n```\n"
    );
    std::fs::write(&path, card::render(&meta, &body)?)
        .with_context(|| format!("writing {}", path.display()))
}
