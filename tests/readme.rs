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
