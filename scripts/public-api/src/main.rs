//! Prints the public API in rustdoc JSON `argv[1]`, one item a line, sorted: every module,
//! type, field, variant, function with its signature, trait impl and auto trait (Send, Sync:
//! their loss breaks callers too). Blanket impls (`From<T> for T`, `Any`, ...) come with
//! every type and are left out.

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: flash-attn-wgpu-public-api <rustdoc JSON>");
        std::process::exit(2);
    };
    let api = match public_api::Builder::from_rustdoc_json(&path)
        .omit_blanket_impls(true)
        .build()
    {
        Ok(api) => api,
        Err(e) => {
            eprintln!("public-api: {path}: {e}");
            std::process::exit(1);
        }
    };
    // sorted, without the headers of inherent impl blocks (`impl Context`): which block of
    // which file a method sits in is no part of the API, and moving it must not look like a
    // change; trait impls (`impl Clone for ..`) stay
    let mut lines: Vec<String> = api
        .items()
        .map(|item| item.to_string())
        .filter(|line| !(line.starts_with("impl") && !line.contains(" for ")))
        .collect();
    lines.sort();
    lines.dedup();
    for line in lines {
        println!("{line}");
    }
}
