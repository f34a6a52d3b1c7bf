//! The README's two set-up commands are the ones CI and users run.

fn readme_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    readme
        .lines()
        .filter(|l| l.starts_with("bash scripts/ensure-vulkan.sh && "))
        .map(str::to_string)
        .collect()
}

#[test]
fn ci_runs_the_readme_test_command_verbatim() {
    let cmds = readme_commands();
    let test_cmd = cmds
        .iter()
        .find(|c| c.contains("scripts/run-tests.sh"))
        .expect("a test command in README");
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l == test_cmd),
        "CI must run `{test_cmd}`"
    );
}

#[test]
fn readme_runs_the_quickstart_example() {
    let cmds = readme_commands();
    assert!(cmds
        .iter()
        .any(|c| c.ends_with("cargo run --release --example quickstart")));
}

/// docs/PERFORMANCE.md's rule: a current figure is the median of at least three interleaved
/// rounds, or it says it is not. Each speed row of "Current figures" names its rounds or runs.
#[test]
fn every_current_performance_figure_says_its_rounds() {
    let perf = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/PERFORMANCE.md"
    ))
    .unwrap();
    let rows: Vec<&str> = perf
        .lines()
        .skip_while(|l| l.trim() != "## Current figures")
        .skip(1)
        .skip_while(|l| !l.starts_with("| "))
        .skip(2) // the header and the separator
        .take_while(|l| l.starts_with("| "))
        .collect();
    assert!(
        rows.len() > 5,
        "the table under \"## Current figures\" was not found"
    );
    let mut missing = Vec::new();
    for row in rows {
        let first = row
            .trim_start_matches('|')
            .split('|')
            .next()
            .unwrap()
            .trim();
        if first == "any GPU"
            || first == "CUDA path"
            || first.starts_with("the README test command")
        {
            continue;
        }
        let text = row.to_lowercase();
        if !text.contains("round") && !text.contains("one run") {
            missing.push(first.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "rows of docs/PERFORMANCE.md's current figures that say neither their rounds nor \"one run\": {missing:?}"
    );
}
