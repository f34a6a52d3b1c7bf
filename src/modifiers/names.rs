//! The names in a user snippet's text, read without a parse (so that it runs where naga does
//! not, on wasm32): its tokens, the names it declares at module scope, every identifier, a
//! renaming of whole identifiers (the composed masks'), and the prefix under which code
//! generated around the snippet writes its own names. Below everything that reads snippets:
//! the checks (user_code.rs), the derivation (derive.rs) and the CUDA translation
//! (to_cuda.rs).

/// The names a WGSL source declares at module scope, each with its line (from 1), in order:
/// those after `fn`, `struct`, `const`, `override`, `alias`, `let` and `var` (in any address
/// space: `var<storage, read> q`, `var<workgroup>`, `var<private>`, a bare `var`) outside
/// every brace, comments skipped. A scan of the text, not a parse, so that it runs where
/// naga does not (wasm32) and finds what naga's module drops (aliases); the unit tests check
/// it against naga on every kernel.
pub(crate) fn declarations(source: &str) -> Vec<(String, usize)> {
    // the code's tokens (words, or one punctuation character) with their lines
    let tokens: Vec<(String, usize)> = lex(source)
        .into_iter()
        .filter(|t| t.code)
        .map(|t| (t.text.to_string(), t.line))
        .collect();
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].0.as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            "fn" | "struct" | "const" | "override" | "alias" | "let" | "var" if depth == 0 => {
                let mut j = i + 1;
                // var's address space and access mode: `<` .. `>`
                if tokens[i].0 == "var" && tokens.get(j).is_some_and(|t| t.0 == "<") {
                    while tokens.get(j).is_some_and(|t| t.0 != ">") {
                        j += 1;
                    }
                    j += 1;
                }
                if let Some((name, at)) = tokens.get(j) {
                    if name.starts_with(|c: char| c.is_alphabetic() || c == '_') {
                        names.push((name.clone(), *at));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    names
}

/// A piece of a source: a word (an identifier, a keyword or a number with its suffix), one
/// punctuation character, or text that is not code (white space, a comment: block comments
/// nest, as in WGSL), with the line it starts on.
struct Token<'a> {
    text: &'a str,
    line: usize,
    code: bool,
}

/// `source` cut into [`Token`]s, which put together give it back: what [`declarations`] and
/// [`rename_identifiers`] read it by.
fn lex(source: &str) -> Vec<Token<'_>> {
    let bytes = source.as_bytes();
    let at = |k: usize| bytes.get(k).copied().unwrap_or(0);
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let (mut tokens, mut k, mut line) = (Vec::new(), 0, 1);
    while k < source.len() {
        let start = k;
        let c = source[k..].chars().next().unwrap_or(' ');
        let code = if at(k) == b'/' && at(k + 1) == b'*' {
            let mut depth = 0usize;
            while k < source.len() {
                if at(k) == b'/' && at(k + 1) == b'*' {
                    depth += 1;
                    k += 2;
                } else if at(k) == b'*' && at(k + 1) == b'/' {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            false
        } else if at(k) == b'/' && at(k + 1) == b'/' {
            k += source[k..].find('\n').unwrap_or(source.len() - k);
            false
        } else if word(c) {
            k += source[k..]
                .find(|c: char| !word(c))
                .unwrap_or(source.len() - k);
            true
        } else {
            k += c.len_utf8();
            !c.is_whitespace()
        };
        let text = &source[start..k.min(source.len())];
        tokens.push(Token { text, line, code });
        line += text.matches('\n').count();
    }
    tokens
}

/// Every identifier of `source` (WGSL or CUDA C; keywords and type names among them), in
/// order: the words of its code that do not start with a digit, comments skipped.
pub(crate) fn identifiers(source: &str) -> Vec<&str> {
    lex(source)
        .into_iter()
        .filter(|t| t.code && t.text.starts_with(|c: char| c.is_alphabetic() || c == '_'))
        .map(|t| t.text)
        .collect()
}

/// The prefix of every name that code generated around a user's snippet writes (the derived
/// derivatives' twins and temporaries, the CUDA translation's): `gen_`, or `gen{k}_` for the
/// first k that begins no identifier of `texts` (the snippet, its stand-ins, code derived
/// before), so that no name the user wrote can equal or shadow a generated one and no
/// generated name can hide one of the user's. The kernels, WGSL and CUDA, define no name that
/// begins with `gen` (a unit test), so a generated module-scope name meets none of theirs
/// either.
pub(crate) fn fresh_prefix(texts: &[&str]) -> String {
    let words: Vec<&str> = texts.iter().flat_map(|t| identifiers(t)).collect();
    (0..)
        .map(|k| match k {
            0 => "gen_".to_string(),
            k => format!("gen{k}_"),
        })
        .find(|p| !words.iter().any(|w| w.starts_with(p.as_str())))
        .unwrap_or_default()
}

/// `source` (WGSL or CUDA C) with every identifier that `names` maps renamed to its image:
/// whole identifiers only, not a member after a `.`; comments as they are.
pub(crate) fn rename_identifiers(
    source: &str,
    names: &std::collections::HashMap<String, String>,
) -> String {
    let mut out = String::with_capacity(source.len());
    let mut last_code = "";
    for t in lex(source) {
        match names.get(t.text) {
            Some(to) if t.code && last_code != "." => out.push_str(to),
            _ => out.push_str(t.text),
        }
        if t.code {
            last_code = t.text;
        }
    }
    out
}
