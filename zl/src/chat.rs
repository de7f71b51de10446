//! `zl chat`: a small interactive chat against a running cluster, streaming tokens as they come. It speaks the
//! Anthropic Messages API over plain HTTP/1.1 (the local cluster's); the URL, key and model default to the ones
//! `zl up` wrote to its data dir. Ctrl-C while an answer streams stops that answer (the connection closes, so the
//! cluster stops generating it) and the conversation goes on; Ctrl-C at the prompt quits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

#[derive(Args, Debug)]
pub(crate) struct ChatArgs {
    /// The frontend's URL (http only), e.g. http://127.0.0.1:8080. Default: the running `zl up`'s.
    #[arg(long, env = "ZL_URL")]
    url: Option<String>,
    /// API key. Default: the running `zl up`'s.
    #[arg(long, env = "ZL_API_KEY")]
    api_key: Option<String>,
    /// Model id. Default: the running `zl up`'s.
    #[arg(long)]
    model: Option<String>,
    /// A system prompt.
    #[arg(long, default_value = "You are a helpful assistant.")]
    system: String,
    /// Longest answer, in tokens.
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Sampling temperature (0 is greedy: the small bundled model answers best that way).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// `zl up`'s data dir, to find its cluster.json.
    #[arg(long, env = "ZL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Ask this one question, print the answer and exit (with an error when it fails): for scripts, and the
    /// chart's `helm test`.
    #[arg(long)]
    prompt: Option<String>,
}

/// A chunked HTTP/1.1 body, de-chunked.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.trim().is_empty() {
                // The CRLF after the previous chunk.
                line.clear();
                self.inner.read_line(&mut line)?;
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left = size;
        }
        let n = buf.len().min(self.left);
        let read = self.inner.read(&mut buf[..n])?;
        self.left -= read;
        Ok(read)
    }
}

fn host_port(url: &str) -> Result<String> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("--url {url}: zl chat speaks plain http:// only (the local cluster's); use an SDK for https");
    };
    let host = rest.trim_end_matches('/');
    Ok(if host.contains(':') { host.to_owned() } else { format!("{host}:80") })
}

/// What Ctrl-C acts on: the connection of the answer streaming now, if any.
#[derive(Default)]
struct Interrupt {
    /// A handle on the streaming answer's connection; `None` at the prompt.
    streaming: Mutex<Option<TcpStream>>,
    /// Set when Ctrl-C stopped the answer.
    stopped: AtomicBool,
}

impl Interrupt {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<TcpStream>> {
        self.streaming.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ctrl-C: stop the answer streaming now (true), or, at the prompt, say that the chat should end (false).
    fn press(&self) -> bool {
        match self.slot().take() {
            Some(stream) => {
                self.stopped.store(true, Ordering::SeqCst);
                let _ = stream.shutdown(Shutdown::Both);
                true
            }
            None => false,
        }
    }

    /// Catch Ctrl-C from now on: each press stops the streaming answer, or ends the process at the prompt.
    fn catch(self: &Arc<Self>) {
        let me = self.clone();
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    if !me.press() {
                        eprintln!();
                        std::process::exit(130);
                    }
                }
            });
        });
    }
}

/// Send one turn and print the answer as it streams; returns the full answer (what came, if Ctrl-C stopped it).
fn turn(addr: &str, key: &str, body: &Value, out: &mut impl Write, interrupt: &Interrupt) -> Result<String> {
    let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    *interrupt.slot() = Some(stream.try_clone()?);
    let answer = stream_answer(stream, addr, key, body, out, interrupt);
    interrupt.slot().take();
    answer
}

fn stream_answer(
    mut stream: TcpStream,
    addr: &str,
    key: &str,
    body: &Value,
    out: &mut impl Write,
    interrupt: &Interrupt,
) -> Result<String> {
    let payload = body.to_string();
    write!(
        stream,
        "POST /v1/messages HTTP/1.1\r\nHost: {addr}\r\nx-api-key: {key}\r\nanthropic-version: 2023-06-01\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut chunked = false;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if line.to_ascii_lowercase().starts_with("transfer-encoding:") && line.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked { inner: reader, left: 0, done: false }))
    } else {
        Box::new(reader)
    };
    if status != 200 {
        let text: String = body.lines().map_while(Result::ok).collect();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        bail!("HTTP {status}: {message}");
    }
    let mut answer = String::new();
    for line in body.lines() {
        if interrupt.stopped.load(Ordering::SeqCst) {
            break;
        }
        let line = match line {
            Ok(line) => line,
            Err(_) if interrupt.stopped.load(Ordering::SeqCst) => break,
            Err(e) => return Err(e.into()),
        };
        let Some(data) = line.strip_prefix("data: ") else { continue };
        let event: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        match event["type"].as_str() {
            Some("content_block_delta") => {
                let text = event["delta"]["text"].as_str().unwrap_or("");
                answer.push_str(text);
                write!(out, "{text}")?;
                out.flush()?;
            }
            Some("error") => bail!("the stream failed: {}", event["error"]["message"].as_str().unwrap_or("?")),
            Some("message_stop") => break,
            _ => {}
        }
    }
    writeln!(out)?;
    Ok(answer)
}

pub(crate) fn run(args: ChatArgs) -> Result<()> {
    let local = crate::local::LocalCluster::read(args.data_dir.as_deref());
    let url = local.pick(args.url.as_deref(), "http", "--url")?;
    let key = local.pick(args.api_key.as_deref(), "api_key", "--api-key")?;
    let model = local.pick(args.model.as_deref(), "model", "--model")?;
    let addr = host_port(&url)?;
    if let Some(prompt) = &args.prompt {
        let body = json!({
            "model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "system": args.system, "stream": true, "messages": [{"role": "user", "content": prompt}],
        });
        let interrupt = Interrupt::default();
        turn(&addr, &key, &body, &mut std::io::stdout(), &interrupt)
            .with_context(|| format!("asking {model} at {url}"))?;
        return Ok(());
    }
    let interrupt = Arc::new(Interrupt::default());
    interrupt.catch();
    eprintln!(
        "zl chat with {model} at {url}. Ctrl-C stops an answer; an empty line, Ctrl-D or Ctrl-C at the prompt ends it."
    );
    let mut history: Vec<Value> = Vec::new();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        write!(stdout, "> ")?;
        stdout.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        history.push(json!({"role": "user", "content": line.trim_end()}));
        let body = json!({
            "model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "system": args.system, "stream": true, "messages": history,
        });
        let answer = turn(&addr, &key, &body, &mut stdout, &interrupt);
        if interrupt.stopped.swap(false, Ordering::SeqCst) {
            // What came of the answer stays in the conversation, as the model wrote it so far.
            eprintln!("[stopped]");
            match answer {
                Ok(text) if !text.is_empty() => history.push(json!({"role": "assistant", "content": text})),
                _ => {
                    history.pop();
                }
            }
            continue;
        }
        match answer {
            Ok(answer) => history.push(json!({"role": "assistant", "content": answer})),
            Err(e) => {
                eprintln!("error: {e:#}");
                history.pop();
            }
        }
    }
}
