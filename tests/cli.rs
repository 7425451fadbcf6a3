//! The `llmslo` binary itself: configuration errors, precedence, signals and the demo.

use crate::common::terminate;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

fn llmslo() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_llmslo"));
    for var in [
        "LLMSLO_UPSTREAM",
        "LLMSLO_LISTEN",
        "LLMSLO_METRICS_LISTEN",
        "LLMSLO_CONFIG",
        "LLMSLO_LOG",
        "LLMSLO_LOG_FORMAT",
        "LLMSLO_WORKER_THREADS",
    ] {
        command.env_remove(var);
    }
    command
}

fn config_file(name: &str, yaml: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("llmslo-cli-{}-{name}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn run_and_fail(command: &mut Command) -> (i32, String) {
    let output = command.output().unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_config_exits_64_naming_the_key() {
    let cases = [
        (
            "unknown-key",
            "upstream: http://127.0.0.1:1\nmax_modles: 3\n",
            "max_modles",
        ),
        (
            "bad-type",
            "upstream: http://127.0.0.1:1\nmax_peek_bytes: lots\n",
            "max_peek_bytes",
        ),
        (
            "bad-value",
            "upstream: http://127.0.0.1:1\nmax_models: 0\n",
            "max_models",
        ),
        ("bad-upstream", "upstream: ftp://engine:443\n", "upstream"),
        (
            "bad-buckets",
            "upstream: http://127.0.0.1:1\nbuckets:\n  ttft: [1, 0.5]\n",
            "buckets.ttft",
        ),
        ("not-yaml", "upstream: [unclosed\n", "line"),
    ];
    // `check-config` refuses every bad file; `run` refuses only the ones it cannot forward
    // with (no usable upstream), and runs without the others (fail-open, tested elsewhere).
    for (name, yaml, key) in cases {
        let path = config_file(name, yaml);
        let (code, stderr) = run_and_fail(llmslo().arg("check-config").arg(&path));
        assert_eq!(code, 64, "{name}: {stderr}");
        assert!(stderr.contains(key), "{name}: `{key}` not in {stderr}");
        if ["bad-upstream", "not-yaml"].contains(&name) {
            let (code, stderr) = run_and_fail(llmslo().args(["run", "--config"]).arg(&path));
            assert_eq!(code, 64, "{name}: {stderr}");
            assert!(stderr.contains(key), "{name}: `{key}` not in {stderr}");
        }
        std::fs::remove_file(path).unwrap();
    }
    let path = config_file("via-env", "upstream: [unclosed\n");
    let (code, stderr) = run_and_fail(llmslo().arg("run").env("LLMSLO_CONFIG", &path));
    assert_eq!(
        code, 64,
        "LLMSLO_CONFIG names the file, and it has no upstream: {stderr}"
    );
    assert!(stderr.contains("via-env"), "{stderr}");
    std::fs::remove_file(path).unwrap();
    let (code, stderr) = run_and_fail(llmslo().args(["run", "--config", "/nonexistent/llmslo.yaml"]));
    assert_eq!(code, 64);
    assert!(stderr.contains("/nonexistent/llmslo.yaml"), "{stderr}");
}

#[test]
fn missing_or_bad_flags_and_env_exit_64() {
    let (code, stderr) = run_and_fail(llmslo().arg("run"));
    assert_eq!(code, 64);
    assert!(
        stderr.contains("upstream") && stderr.contains("LLMSLO_UPSTREAM"),
        "{stderr}"
    );
    // One format, naming where the value came from.
    let (code, stderr) = run_and_fail(llmslo().arg("run").env("LLMSLO_UPSTREAM", "ftp://engine"));
    assert_eq!(code, 64);
    assert_eq!(
        stderr.trim(),
        "llmslo: environment variable LLMSLO_UPSTREAM: `ftp://engine` must start with http:// or https://"
    );
    let (code, stderr) =
        run_and_fail(llmslo().args(["run", "--upstream", "http://127.0.0.1:1", "--listen", "everywhere"]));
    assert_eq!(code, 64);
    assert_eq!(
        stderr.trim(),
        "llmslo: flag --listen: `everywhere` is not an address like 0.0.0.0:8080 or :8080"
    );
    let (code, stderr) = run_and_fail(
        llmslo()
            .args(["run", "--upstream", "http://127.0.0.1:1"])
            .env("LLMSLO_ENGINE", "triton"),
    );
    assert_eq!(code, 64);
    assert_eq!(
        stderr.trim(),
        "llmslo: environment variable LLMSLO_ENGINE: `triton` is not an engine: auto, vllm, tgi, sglang, llamacpp or openai"
    );
    let (code, stderr) = run_and_fail(llmslo().args(["--worker-threads", "1", "bench", "--streams", "1"]));
    assert_eq!(code, 64, "accepted and ignored before");
    assert!(stderr.contains("--proxy-workers"), "{stderr}");
    let (code, stderr) = run_and_fail(llmslo().args(["run", "--upstream", "http://127.0.0.1:1", "--role", "leader"]));
    assert_eq!(code, 64);
    assert_eq!(
        stderr.trim(),
        "llmslo: flag --role: `leader` is not a role: aggregated, prefill, decode or router"
    );
    let (code, stderr) = run_and_fail(
        llmslo()
            .args([
                "run",
                "--upstream",
                "http://127.0.0.1:1",
                "--prefill-relay",
                "127.0.0.1:8299",
            ])
            .env("LLMSLO_ROLE", "prefill"),
    );
    assert_eq!(code, 64);
    assert!(
        stderr.contains("flag --prefill-relay") && stderr.contains("role: decode"),
        "{stderr}"
    );
    // A relay with no pool would send legs wherever a request says: refused, naming the pool.
    let (code, stderr) = run_and_fail(llmslo().args([
        "run",
        "--upstream",
        "http://127.0.0.1:1",
        "--role",
        "decode",
        "--prefill-relay",
        "127.0.0.1:8299",
    ]));
    assert_eq!(code, 64);
    assert!(
        stderr.contains("flag --prefill-relay") && stderr.contains("needs prefill_pool"),
        "{stderr}"
    );
    let (code, stderr) = run_and_fail(
        llmslo()
            .args(["run", "--upstream", "http://127.0.0.1:1", "--role", "decode"])
            .args(["--prefill-relay", "127.0.0.1:8299"])
            .env("LLMSLO_PREFILL_POOL", "10.1.2.3:8000,http://prefill"),
    );
    assert_eq!(code, 64);
    assert!(
        stderr.contains("LLMSLO_PREFILL_POOL") && stderr.contains("`http://prefill` is not a pod address"),
        "{stderr}"
    );
    let (code, stderr) = run_and_fail(llmslo().args(["check-config", "/dev/null", "--engine", "triton"]));
    assert_eq!(code, 64);
    assert!(
        stderr.starts_with("llmslo: flag --engine: `triton` is not an engine"),
        "{stderr}"
    );
    let (code, stderr) = run_and_fail(llmslo().args(["simulate", "--ttft", "soon"]));
    assert_eq!(code, 2, "clap usage error");
    assert!(stderr.contains("--ttft"), "{stderr}");
    let (code, stderr) = run_and_fail(llmslo().args(["simulate", "--batching", "--step-jitter", "1.5"]));
    assert_eq!(code, 2, "clap usage error");
    assert!(stderr.contains("--step-jitter"), "{stderr}");
}

/// Starts `llmslo run` and returns it with the metrics address from its start-up log line,
/// and the rest of its log once it exits.
fn start_run(command: &mut Command) -> (std::process::Child, String, std::thread::JoinHandle<Vec<String>>) {
    let mut child = command.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let metrics = lines.by_ref().take(50).map_while(Result::ok).find_map(|line| {
        let rest = &line[line.find("\"metrics_addr\":\"")? + 16..];
        Some(rest[..rest.find('"')?].to_string())
    });
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    match metrics {
        Some(addr) => (child, addr, rest),
        None => {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("no start-up line with metrics_addr");
        }
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(
        &mut stream,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn flags_beat_env_beat_file_and_sigterm_exits_0() {
    let path = config_file(
        "precedence",
        "upstream: http://127.0.0.1:1\nlisten: \"not an address\"\nmetrics_listen: 127.0.0.1:1\n",
    );
    let (mut child, metrics, log) = start_run(
        llmslo()
            .args(["run", "--config"])
            .arg(&path)
            .args(["--listen", "127.0.0.1:0"]) // the flag beats the file's bad value
            .env("LLMSLO_METRICS_LISTEN", "127.0.0.1:0") // the env beats the file
            .env("LLMSLO_LOG_FORMAT", "json"),
    );
    assert!(
        metrics.starts_with("127.0.0.1:") && metrics != "127.0.0.1:1",
        "{metrics}"
    );
    assert!(http_get(&metrics, "/healthz").starts_with("HTTP/1.1 200"));
    let metrics_text = http_get(&metrics, "/metrics");
    assert!(metrics_text.contains("llmslo_build_info"));
    terminate(&mut child);
    // Between SIGTERM and the exit, the log says what the drain does.
    let log = log.join().unwrap();
    let stopping = log
        .iter()
        .position(|l| l.contains("stopping: new connections are refused"));
    let stopped = log.iter().position(|l| l.contains("llmslo sidecar stopped"));
    assert!(matches!((stopping, stopped), (Some(a), Some(b)) if a < b), "{log:#?}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_second_interrupt_exits_at_once_and_a_restart_on_the_port_says_who_holds_it() {
    use std::time::Duration;
    let (mut child, metrics, log) = start_run(
        llmslo()
            .args(["run", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("LLMSLO_LOG_FORMAT", "json"),
    );
    // Scraped once, the sidecar keeps /metrics up for final_scrape_grace (15 s) after a stop.
    assert!(http_get(&metrics, "/metrics").contains("llmslo_build_info"));
    let pid = child.id().to_string();
    let interrupt = || {
        let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(sent.success());
    };
    // A second sidecar on the same metrics address says who holds it.
    let second = llmslo()
        .args(["run", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", &metrics])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        said.contains("an llmslo serves /metrics there") && said.contains("final_scrape_grace"),
        "{said}"
    );
    interrupt();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "waiting for the final scrape");
    let started = std::time::Instant::now();
    interrupt();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "still running a second after a second interrupt"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    let log = log.join().unwrap().join("\n");
    assert!(log.contains("stopped again: exiting now"), "{log}");
}

#[test]
fn the_demo_stops_within_two_seconds_of_ctrl_c() {
    use std::io::BufRead;
    use std::time::Duration;
    let mut child = llmslo()
        .args(["demo", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--interval", "1s", "--concurrency", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Its first view means the load is streaming: the stop has streams to cut short.
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let shown = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("clients streaming"));
    assert!(shown, "the demo showed its first view");
    // Read on while it stops, so that a full pipe never holds it up.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let started = std::time::Instant::now();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the demo still runs two seconds after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert!(rest.join().unwrap() > 0, "its summary, printed on the way out");
}

#[test]
fn the_simulator_logs_the_address_the_system_chose_for_port_0() {
    let mut child = llmslo()
        .args(["simulate", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listen = lines.by_ref().take(20).map_while(Result::ok).find_map(|line| {
        let (_, rest) = line.split_once("simulated engine serving listen=")?;
        Some(rest.split_whitespace().next()?.to_string())
    });
    let answer = listen.as_deref().map(|addr| http_get(addr, "/v1/models"));
    terminate(&mut child);
    let listen = listen.expect("a line naming the address");
    assert!(listen.starts_with("127.0.0.1:") && !listen.ends_with(":0"), "{listen}");
    assert!(answer.unwrap().starts_with("HTTP/1.1 200"));
}

#[test]
fn demo_runs_and_prints_a_table() {
    let engine_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = llmslo()
        .args([
            "demo",
            "--duration",
            "4s",
            "--interval",
            "2",
            "--concurrency",
            "4",
            "--ramp",
            "4s",
        ])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--engine-listen", &format!("127.0.0.1:{engine_port}")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("simulated engine on http://127.0.0.1:{engine_port}")),
        "the engine's port is the one chosen: {stdout}"
    );
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("TTFT p99") && stdout.contains("TPOT p50"), "{stdout}");
    for api in ["chat", "responses", "messages"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(api)),
            "the demo speaks {api}: {stdout}"
        );
    }
    assert!(stdout.contains("answer p50"), "{stdout}");
    let last_row = stdout.lines().rev().find(|l| l.starts_with("llama-sim-8b")).unwrap();
    let requests: u64 = last_row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(requests > 0, "{stdout}");
    assert!(last_row.contains("ms"), "percentiles shown: {last_row}");
    // The SLO view: every SLO for every model, goodput, and the ramp's client count.
    for slo in ["ttft-500ms", "tpot-50ms", "availability"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(slo) && l.contains("llama-sim-8b")),
            "{slo}: {stdout}"
        );
    }
    assert!(
        stdout.contains("burn 5m") && stdout.contains("budget spent"),
        "{stdout}"
    );
    assert!(stdout.contains("goodput llama-sim-8b"), "{stdout}");
    assert!(stdout.contains("of 4 clients streaming"), "{stdout}");
    assert!(
        !stdout.contains('\x1b'),
        "no redraw codes when stdout is not a terminal"
    );
    let widest = stdout.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 120, "the view fits 120 columns: {widest}\n{stdout}");
}

#[test]
fn inject_reads_stdin_and_writes_the_injected_yaml() {
    use std::io::Write;
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm}\nspec:\n  template:\n    metadata:\n      \
                      labels: {llmslo.io/inject: \"true\"}\n    spec:\n      containers:\n        - name: vllm\n          \
                      image: vllm\n          ports: [{name: http, containerPort: 8000}]\n";
    let mut child = llmslo()
        .args(["inject", "--sidecar", "classic", "--image", "llmslo:test"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(deployment.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let yaml = String::from_utf8(output.stdout).unwrap();
    assert!(
        yaml.contains("image: llmslo:test") && yaml.contains("name: llmslo-engine"),
        "{yaml}"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("injected 1 pod template"));

    let bad = llmslo().args(["inject", "-f", "/nonexistent.yaml"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent.yaml"));
}

/// A Deployment whose Service targets the engine's port by number, as a file.
fn bypassing_stream(name: &str) -> std::path::PathBuf {
    config_file(
        name,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm}\nspec:\n  template:\n    metadata:\n      \
         labels: {app: vllm, llmslo.io/inject: \"true\"}\n    spec:\n      containers:\n        - name: vllm\n          \
         image: vllm\n          ports: [{name: http, containerPort: 8000}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: vllm}\nspec: {selector: {app: vllm}, ports: [{port: 80, targetPort: 8000}]}\n",
    )
}

/// `llmslo inject -f FILE --image llmslo:test EXTRA…`: its exit code, stdout and stderr.
fn inject_file(file: &std::path::Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let output = llmslo()
        .args(["inject", "-f", file.to_str().unwrap(), "--image", "llmslo:test"])
        .args(extra)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn inject_warns_about_a_service_that_would_bypass_the_sidecar() {
    let file = bypassing_stream("bypass-warn");
    let inject = |extra: &[&str]| inject_file(&file, extra);
    let (code, stdout, stderr) = inject(&[]);
    assert_eq!(code, Some(0));
    assert!(
        stderr.contains("Service/vllm port 80 targets the engine's port 8000") && stderr.contains("targetPort: http"),
        "{stderr}"
    );
    assert!(stdout.contains("targetPort: 8000") && stdout.contains("name: llmslo-engine"));

    let (code, stdout, stderr) = inject(&["--strict"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty(), "--strict prints nothing to apply");
    assert!(
        stderr.contains("--strict: 1 Service port(s) would bypass the sidecar"),
        "{stderr}"
    );

    let (code, stdout, stderr) = inject(&["--rewrite-services", "--strict"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("rewrote targetPort 8000 to http"), "{stderr}");
    assert!(stdout.contains("targetPort: http") && !stdout.contains("targetPort: 8000"));
}

#[test]
fn inject_fails_on_a_misspelt_annotation_unless_lenient_and_strict_fails_on_it() {
    let file = std::env::temp_dir().join(format!("llmslo-cli-{}-typo.yaml", std::process::id()));
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: vllm\n  labels: {llmslo.io/inject: \"true\"}\n  \
         annotations: {llmslo.io/slo-config-map: chat-slos}\nspec:\n  containers:\n    - name: vllm\n      \
         image: vllm\n      ports: [{name: http, containerPort: 8000}]\n",
    )
    .unwrap();
    let inject = |extra: &[&str]| inject_file(&file, extra);
    // In a `kubectl get | llmslo inject | kubectl apply` pipe nobody reads stderr: the pod
    // would get a sidecar without its SLOs. The command fails, and the pipe with it.
    let (code, stdout, stderr) = inject(&[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("llmslo: warning: Pod/vllm: unknown annotation llmslo.io/slo-config-map, ignored (did you mean llmslo.io/slo-configmap"),
        "{stderr}"
    );
    assert!(stderr.contains("pass --lenient"), "{stderr}");
    let (code, stdout, stderr) = inject(&["--lenient"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("did you mean llmslo.io/slo-configmap"), "{stderr}");
    assert!(stdout.contains("name: llmslo"));
    let (code, stdout, stderr) = inject(&["--strict"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("1 llmslo.io/ label or annotation warning(s)"),
        "{stderr}"
    );
}

#[test]
fn inject_without_an_image_says_how_to_build_one() {
    let file = bypassing_stream("bypass-no-image");
    let output = llmslo()
        .args(["inject", "-f", file.to_str().unwrap()])
        .env_remove("LLMSLO_IMAGE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no sidecar image") && stderr.contains("docker build"),
        "{stderr}"
    );

    let from_env = llmslo()
        .args(["inject", "-f", file.to_str().unwrap()])
        .env("LLMSLO_IMAGE", "registry.local/llmslo:1")
        .output()
        .unwrap();
    assert_eq!(from_env.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&from_env.stdout).contains("image: registry.local/llmslo:1"));
}

#[test]
fn check_config_validates_an_slo_only_file_and_still_names_bad_keys() {
    let slo_only = "service: chat\nperiod: 30d\nslos:\n  - name: tpot-50ms\n    objective: 99\n    tpot: 50ms\n\
                    goodput:\n  require: [tpot-50ms]\n";
    let path = config_file("slo-only", slo_only);
    let output = llmslo().arg("check-config").arg(&path).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("name: tpot-50ms") && stdout.contains("service: chat"),
        "{stdout}"
    );
    assert!(!stdout.contains("upstream:"), "no invented upstream is shown: {stdout}");
    assert!(
        stderr.contains("names no upstream") && stderr.contains("--upstream"),
        "{stderr}"
    );
    std::fs::remove_file(path).unwrap();

    let path = config_file("slo-only-bad", "slos:\n  - {name: t, objective: 200, tpot: 50ms}\n");
    let (code, stderr) = run_and_fail(llmslo().arg("check-config").arg(&path));
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("slos[0].objective"), "{stderr}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn text_logs_carry_no_colour_when_stderr_is_not_a_terminal() {
    let mut child = llmslo()
        .args(["run", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "text"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .take(20)
        .map_while(Result::ok)
        .find(|line| line.contains("llmslo sidecar started"))
        .expect("a start-up line");
    std::thread::spawn(move || lines.for_each(drop));
    terminate(&mut child);
    assert!(!started.contains('\x1b'), "ANSI escapes in a piped log: {started:?}");
}

#[test]
fn an_slo_objective_written_as_a_ratio_is_refused_with_its_file_and_line() {
    let yaml = "upstream: http://127.0.0.1:1\nslos:\n  - name: tpot\n    objective: 0.99\n    tpot: 50ms\n";
    let path = config_file("ratio", yaml);
    for command in ["check-config", "rules"] {
        let (code, stderr) = run_and_fail(llmslo().arg(command).arg(&path));
        assert_eq!(code, 64, "{command}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:4:", path.display())),
            "{command}: {stderr}"
        );
        assert!(stderr.contains("did you mean 99?"), "{command}: {stderr}");
    }
    std::fs::remove_file(path).unwrap();
    let yaml = "slos:\n  - {name: a, objective: 99, ttft: 1s}\n  - {name: b, objective: 90, tpot: 1s}\n";
    let path = config_file("unreachable", yaml);
    // A 90 % objective is accepted; the alert branch it could never fire is left out, and said so.
    for command in ["rules", "check-config"] {
        let output = llmslo().arg(command).arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{command}: {stderr}");
        assert!(
            stderr.contains("SLO b: the 14.4x page branch (1h and 5m) is left out: at objective 90"),
            "{command}: {stderr}"
        );
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_busy_port_names_its_address_and_the_flag_that_changes_it() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "run",
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                &addr,
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            "--listen",
        ),
        (
            &[
                "run",
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                &addr,
            ],
            "--metrics-listen",
        ),
        (&["demo", "--listen", &addr, "--duration", "1s"], "--listen"),
    ];
    for (args, flag) in cases {
        let (code, stderr) = run_and_fail(llmslo().args(args));
        assert_ne!(code, 0, "{args:?}");
        assert!(
            stderr.contains(&format!("cannot listen on {addr}")),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("choose another address with {flag}")),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn an_unreachable_upstream_is_logged_once_with_the_reason() {
    let mut child = llmslo()
        .args(["run", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        BufReader::new(stderr).read_to_string(&mut log).unwrap();
        log
    });
    std::thread::sleep(std::time::Duration::from_secs(12)); // three probes, 5 s apart
    terminate(&mut child);
    let log = reader.join().unwrap();
    let lost: Vec<&str> = log.lines().filter(|l| l.contains("upstream is not ready")).collect();
    assert_eq!(lost.len(), 1, "once, not every probe:\n{log}");
    assert!(
        lost[0].contains("Connection refused") && lost[0].contains("WARN"),
        "{}",
        lost[0]
    );
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    // `llmslo rules f | head -1`: the pipe closes before the output is written.
    for args in [
        vec!["rules", "examples/llmslo.yaml"],
        vec!["check-config", "examples/llmslo.yaml"],
    ] {
        let mut child = llmslo()
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// jemalloc's option as the binary runs with it, from its statistics at exit.
fn jemalloc_option(conf: &str, option: &str) -> String {
    let output = llmslo()
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", conf)
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let line = stderr
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("opt.{option}:")))
        .unwrap_or_else(|| panic!("no opt.{option} in jemalloc's statistics:\n{stderr}"));
    line.trim().to_string()
}

#[test]
fn freed_pages_go_back_after_a_second_unless_the_operator_says_otherwise() {
    assert_eq!(
        jemalloc_option("stats_print:true", "dirty_decay_ms"),
        "opt.dirty_decay_ms: 1000 (arenas.dirty_decay_ms: 1000)"
    );
    assert_eq!(
        jemalloc_option("stats_print:true,dirty_decay_ms:10000", "dirty_decay_ms"),
        "opt.dirty_decay_ms: 10000 (arenas.dirty_decay_ms: 10000)"
    );
}

/// The `worker_threads` of `llmslo run`'s start-up line, with the process stopped again.
fn started_workers(command: &mut Command) -> Option<u64> {
    let mut child = command.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .take(50)
        .map_while(Result::ok)
        .find(|line| line.contains("llmslo sidecar started"));
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).count());
    terminate(&mut child);
    rest.join().unwrap();
    let started: serde_json::Value = serde_json::from_str(&started?).ok()?;
    started["fields"]["worker_threads"].as_u64()
}

#[test]
fn the_worker_threads_are_what_the_flag_or_the_environment_asks_for() {
    let run = ["run", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"];
    let metrics = ["--metrics-listen", "127.0.0.1:0", "--log-format", "json"];
    // 0 is what the downward API gives a container without a CPU request: one per CPU.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let cases = [
        (Some("3"), None, 3),
        (None, Some("1"), 1),
        (Some("2"), Some("5"), 2),
        (None, Some("0"), cpus),
        (None, None, cpus),
        // An empty variable is the default, as if unset: a template's `value: ""` starts.
        (None, Some(""), cpus),
        (None, Some(" "), cpus),
    ];
    for (flag, env, expected) in cases {
        let mut command = llmslo();
        command.args(run).args(metrics);
        if let Some(threads) = flag {
            command.args(["--worker-threads", threads]);
        }
        if let Some(threads) = env {
            command.env("LLMSLO_WORKER_THREADS", threads);
        }
        assert_eq!(
            started_workers(&mut command),
            Some(expected),
            "flag {flag:?}, environment {env:?}"
        );
    }
    // A bad count is clap's usage error naming the flag, not a panic in the runtime.
    for value in ["1.5", "many", "5000"] {
        let (code, stderr) = run_and_fail(llmslo().args(run).args(["--worker-threads", value]));
        assert_eq!(code, 2, "{value}: {stderr}");
        assert!(stderr.contains("--worker-threads"), "{value}: {stderr}");
        let (code, stderr) = run_and_fail(llmslo().args(run).env("LLMSLO_WORKER_THREADS", value));
        assert_eq!(code, 2, "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{value}: {stderr}");
    }
}

#[test]
fn every_empty_environment_variable_means_its_default() {
    let names: Vec<String> = ["src/cli.rs", "src/cli/args.rs"]
        .iter()
        .flat_map(|file| {
            let help = std::fs::read_to_string(file).unwrap();
            help.split("env = \"")
                .skip(1)
                .map(|rest| rest.split('"').next().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        names.len() >= 10 && names.contains(&"LLMSLO_WORKER_THREADS".to_string()),
        "{names:?}"
    );
    let mut command = llmslo();
    command.args(["check-config", "examples/llmslo.yaml"]);
    for (i, name) in names.iter().enumerate() {
        // Blank is empty too: a template's `value: " "`.
        command.env(name, if i % 2 == 0 { "" } else { " \t" });
    }
    command.env("OTEL_EXPORTER_OTLP_ENDPOINT", "");
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{names:?}: {stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("upstream: http://127.0.0.1:8000/"));
}
