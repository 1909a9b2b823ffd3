//! Command-line errors are one line each: `nightshift: error: ...` with every cause said once,
//! never a stack dump, even with `RUST_BACKTRACE=1`; a directory given as `--model` is called one.

use std::process::Command;

/// Runs `nightshift args` expecting failure; returns stderr.
fn fails(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "error")
        .output()
        .expect("nightshift runs");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert!(
        !err.contains("backtrace") && !err.contains("Caused by") && !err.contains("panicked"),
        "{args:?}: {err}"
    );
    err
}

#[test]
fn errors_are_one_line_with_each_cause_once() {
    let dir = std::env::temp_dir().join(format!("ns-cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let d = dir.to_str().expect("utf-8");
    let missing = dir.join("missing.gguf");
    let m = missing.to_str().expect("utf-8");
    // (args, what the line must say once)
    let rows: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["generate", "--model", d, "--prompt", "x"],
            "expected a GGUF file, found a directory",
        ),
        (
            vec!["tokenize", "--model", d, "--text", "x"],
            "expected a GGUF file, found a directory",
        ),
        (
            vec!["generate", "--model", m, "--prompt", "x"],
            "No such file or directory",
        ),
    ];
    for (args, said) in rows {
        let err = fails(&args);
        let line = err.trim_end();
        assert!(!line.contains('\n'), "{args:?}: more than one line: {err}");
        assert!(line.starts_with("nightshift: error: "), "{args:?}: {err}");
        assert_eq!(line.matches(said).count(), 1, "{args:?}: {err}");
    }
}

/// A report piped into a reader that is gone (`| head`) ends quietly on SIGPIPE instead of
/// panicking on the failed write.
#[test]
fn a_closed_stdout_ends_a_report_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["plan-cluster", "--preset", "qwen3-30b-a3b"])
        .env("RUST_LOG", "error")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("nightshift runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // ended by SIGPIPE (13 on Linux), not a panic's exit status
    assert_eq!(o.status.signal(), Some(13), "{:?}: {err}", o.status);
}
