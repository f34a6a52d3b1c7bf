//! The derivative of a user's `score_mod` with respect to the score, derived from its WGSL
//! (forward mode, on naga's IR), so that a `ScoreMod` needs no hand-written `score_mod_ds`.
//!
//! Each function the score flows through gets a twin that returns `vec2<f32>(value,
//! derivative)` and takes, beside each f32 argument, that argument's derivative. Every
//! expression becomes a `let` of its value and, where it is an f32 that depends on the score,
//! one of its derivative, by the rules of calculus (`a * b` gives `a' b + a b'`, `exp(a)` gives
//! `exp(a) a'`, `select` selects the derivatives, ...); local variables get a derivative
//! variable; `if`, loops, `break`, `continue` and `return` keep their shape. Values that do not
//! depend on the score (indices, captured tensors, constants) have a derivative of zero, and so
//! does a helper's integer or boolean result (constant almost everywhere): such a helper is
//! called as it is. `score_mod_ds` then returns the derivative of `score_mod`'s twin at
//! `(s, 1.0, b, h, i, j)`.
//!
//! **Names.** Every name the derivation writes (twins, their arguments, variables, values,
//! derivatives and call results) begins with one prefix, `gen_` or `gen{k}_`, chosen so that
//! no identifier of the snippet begins with it (`names::fresh_prefix`; the kernels write
//! none that begins with `gen`): a twin is `{p}d_{name}` (`{p}t_{name}` for a trainable
//! tensor's partial), an argument `{p}a0`, a value `{p}v12`, its derivative `{p}d12`, a variable
//! `{p}l3` and `{p}dl3`, a call's result `{p}r7`. So no name the user declares can equal,
//! shadow or be hidden by a generated one. The derived code is compiled beside the snippet
//! before it is returned; should the derivation ever write code naga refuses (a defect), the
//! error names the user's `score_mod` and asks for `score_mod_ds`, never the generated code.
//!
//! **Taken:** scalar `f32`, `u32`, `i32` and `bool` values, literals, constants, arguments and
//! function-scope `let` and `var`; `+ - * / %`, comparisons, logical and bitwise operators,
//! `select`, conversions (`f32(..)`, `u32(..)`, `i32(..)`, `bitcast`); `all` and `any`; the
//! math functions `abs` `sign` `floor` `ceil` `round` `trunc` `fract` `exp` `exp2` `log` `log2`
//! `sqrt` `inverseSqrt` `pow` `tanh` `sin` `cos` `tan` `atan` `sinh` `cosh` `saturate` `min`
//! `max` `clamp` `fma` `step`; `if`, `loop`/`for`/`while`, `break`, `continue`, `return`; calls
//! of the snippet's own helpers and reads of captured tensors.
//!
//! **Refused** (an `Error::UserCode` naming the user's line and what stands there, before any
//! code is derived): every other math function (`atan2`, `asin`, `acos`, `asinh`, `acosh`,
//! `atanh`, `mix`, `smoothstep`, `length`, `dot`, `ldexp`, `degrees`, ... ), vectors, matrices,
//! arrays and structs that depend on the score (a helper that returns one), pointers (a helper
//! that takes `ptr<function, f32>`), module-scope `var<private>` variables (a snippet may
//! declare them, but not in what is derived), and `switch`. Then write `score_mod_ds` by hand.
//! At a kink (`abs` at 0, `min` and `max` where both sides are equal, `select`'s switch) it
//! takes one side, as automatic differentiation does. Off the web only: the wasm32 build has
//! no naga.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use naga::{
    BinaryOperator as B, Expression as E, Handle, Literal, MathFunction as M, Module, Scalar,
    ScalarKind, TypeInner, UnaryOperator as U,
};

use super::names;
use super::user_code::user_error;
use crate::error::Result;

/// `score_mod_ds` and the twins it calls, as WGSL to append to `source` (the user's snippet;
/// `stubs` declare its captured tensors' accessors after it for the parse).
pub(crate) fn score_mod_ds(source: &str, stubs: &str) -> Result<String> {
    let what = "score_mod WGSL (deriving score_mod_ds)";
    let p = names::fresh_prefix(&[source, stubs]);
    let mut out = derive(source, stubs, what, None, &p)?;
    let _ = writeln!(
        out,
        "fn score_mod_ds({p}s: f32, {p}b: u32, {p}h: u32, {p}i: u32, {p}j: u32) -> f32 {{\n    \
         return {}({p}s, 1.0, {p}b, {p}h, {p}i, {p}j).y;\n}}",
        twin_name(&p, false, "score_mod")
    );
    compiles(source, &out, stubs, what)?;
    Ok(out)
}

/// The derivative of `score_mod` with respect to the entry of captured tensor `tensor` that
/// it reads, as WGSL for the kernel of a trainable tensor's gradient (appended to the call's
/// user code there, never to the snippet): `score_mod_dt(s, b, h, i, j) -> f32`, which also
/// leaves the entry's index in the private `score_mod__read` (`0xffffffff` where no entry was
/// read; both names are the kernels', which no snippet may declare). Forward mode again,
/// seeded at the read rather than at the score (twins `{p}t_{name}`). The read must be one
/// call in `score_mod`'s own body, outside loops, so that one index and one partial describe
/// a pair: anything else is an `Error::UserCode` naming the line.
pub(crate) fn score_mod_dt(source: &str, stubs: &str, tensor: &str) -> Result<String> {
    let what = "score_mod WGSL (its trainable tensor's gradient)";
    let p = names::fresh_prefix(&[source, stubs]);
    let mut out = String::from("var<private> score_mod__read: u32;\n");
    out.push_str(&derive(source, stubs, what, Some(tensor), &p)?);
    let _ = writeln!(
        out,
        "fn score_mod_dt({p}s: f32, {p}b: u32, {p}h: u32, {p}i: u32, {p}j: u32) -> f32 {{\n    \
         score_mod__read = 0xffffffffu;\n    \
         return {}({p}s, 0.0, {p}b, {p}h, {p}i, {p}j).y;\n}}",
        twin_name(&p, true, "score_mod")
    );
    compiles(source, &out, stubs, what)?;
    Ok(out)
}

/// The derived code compiles beside the snippet: what the derivation takes it writes as
/// valid WGSL, so this fails only on a defect of the derivation's; then the user is told which
/// of their functions it was, at its line, and to write the derivative by hand, never the
/// compiler's words about code they did not write.
fn compiles(source: &str, derived: &str, stubs: &str, what: &str) -> Result<()> {
    let whole = format!("{source}\n{derived}\n{stubs}");
    let ok = naga::front::wgsl::parse_str(&whole).ok().is_some_and(|m| {
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::empty(),
        )
        .validate(&m)
        .is_ok()
    });
    if ok {
        return Ok(());
    }
    let line = source
        .lines()
        .position(|l| l.contains("fn score_mod("))
        .map(|n| n + 1);
    Err(user_error(
        what,
        line,
        "the derivation does not take this `score_mod` (a defect of the derivation's: please \
         report it); write score_mod_ds by hand"
            .into(),
    ))
}

/// The twins of `score_mod` and the functions it reaches: seeded at the score (`seed`
/// `None`, twins `{p}d_{name}`) or at the one read of captured tensor `seed` (twins
/// `{p}t_{name}`). Every error names a line of `source` and what the user wrote there.
fn derive(source: &str, stubs: &str, what: &str, seed: Option<&str>, p: &str) -> Result<String> {
    let whole = format!("{source}\n{stubs}");
    let lines = source.lines().count();
    let at = |span: naga::Span| at_line(span.location(&whole).line_number, lines);
    let module = naga::front::wgsl::parse_str(&whole).map_err(|e| {
        user_error(
            what,
            e.location(&whole)
                .and_then(|l| at_line(l.line_number, lines)),
            e.message().to_string(),
        )
    })?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| {
        user_error(
            what,
            e.location(&whole)
                .and_then(|l| at_line(l.line_number, lines)),
            e.as_inner().to_string(),
        )
    })?;
    let find = |name: &str| {
        module
            .functions
            .iter()
            .find(|(_, f)| f.name.as_deref() == Some(name))
            .map(|(h, _)| h)
    };
    let Some(root) = find("score_mod") else {
        return Err(user_error(
            what,
            None,
            "expected `fn score_mod(..)`, found none".into(),
        ));
    };
    let seed = match seed {
        None => None,
        Some(name) => {
            let Some(accessor) = find(name) else {
                return Err(user_error(
                    what,
                    None,
                    format!("expected a captured tensor named `{name}`, found none"),
                ));
            };
            one_read(&module, root, accessor, name)
                .map_err(|(span, msg)| user_error(what, span.and_then(at), msg))?;
            Some(accessor)
        }
    };
    let mut d = Deriver {
        module: &module,
        info: &info,
        seed,
        p,
        done: HashSet::new(),
        queue: vec![root],
        out: String::new(),
    };
    while let Some(f) = d.queue.pop() {
        if d.done.insert(f) {
            d.twin(f).map_err(|(span, msg)| {
                let msg = match seed {
                    None => format!("{msg}; write score_mod_ds by hand to use it"),
                    Some(_) => msg,
                };
                user_error(what, span.and_then(at), msg)
            })?;
        }
    }
    Ok(d.out)
}

/// Line `l` where it is one of the snippet's `lines`.
fn at_line(l: u32, lines: usize) -> Option<usize> {
    Some(l as usize).filter(|&l| l <= lines && l > 0)
}

/// Checks that `score_mod` (`root`) reads the captured tensor `accessor` exactly once, in its
/// own body and outside loops: where the read is in a helper or a loop, or is two calls, one
/// pair could read several entries, which one partial cannot describe.
fn one_read(
    module: &Module,
    root: Handle<naga::Function>,
    accessor: Handle<naga::Function>,
    name: &str,
) -> std::result::Result<(), Fail> {
    /// The calls in `b`: (callee, where, in a loop).
    fn scan(
        b: &naga::Block,
        in_loop: bool,
        out: &mut Vec<(Handle<naga::Function>, naga::Span, bool)>,
    ) {
        use naga::Statement as S;
        for (st, span) in b.span_iter() {
            match st {
                S::Block(inner) => scan(inner, in_loop, out),
                S::If { accept, reject, .. } => {
                    scan(accept, in_loop, out);
                    scan(reject, in_loop, out);
                }
                S::Switch { cases, .. } => {
                    for c in cases {
                        scan(&c.body, in_loop, out);
                    }
                }
                S::Loop {
                    body, continuing, ..
                } => {
                    scan(body, true, out);
                    scan(continuing, true, out);
                }
                S::Call { function, .. } => out.push((*function, *span, in_loop)),
                _ => {}
            }
        }
    }
    let rule = "a trainable tensor is read once, in score_mod itself and outside loops, so \
                that a pair reads one entry";
    // the functions score_mod reaches (not the snippet's score_mod_ds and its twins)
    let (mut seen, mut queue) = (HashSet::from([root]), vec![root]);
    let mut own = Vec::new();
    while let Some(fh) = queue.pop() {
        let mut calls = Vec::new();
        scan(&module.functions[fh].body, false, &mut calls);
        let f = &module.functions[fh];
        queue.extend(
            calls
                .iter()
                .map(|c| c.0)
                .filter(|&c| c != accessor && seen.insert(c)),
        );
        let reads: Vec<(naga::Span, bool)> = calls
            .iter()
            .filter(|c| c.0 == accessor)
            .map(|c| (c.1, c.2))
            .collect();
        if fh != root {
            if let Some(&(span, _)) = reads.first() {
                let helper = f.name.as_deref().unwrap_or("a helper");
                return Err((Some(span), format!("`{helper}` reads `{name}`: {rule}")));
            }
        } else {
            own = reads;
        }
    }
    match own.as_slice() {
        [] => Err((None, format!("score_mod never reads `{name}`"))),
        [(span, true), ..] => Err((Some(*span), format!("`{name}` is read in a loop: {rule}"))),
        [_, (span, _), ..] => Err((Some(*span), format!("`{name}` is read twice: {rule}"))),
        [_] => Ok(()),
    }
}

use super::ir_walk::{self, Fail};

struct Deriver<'a> {
    module: &'a Module,
    info: &'a naga::valid::ModuleInfo,
    /// The captured tensor's accessor the twins are seeded at (`None`: the score).
    seed: Option<Handle<naga::Function>>,
    /// The generated names' prefix (module `user_code`'s `fresh_prefix`).
    p: &'a str,
    done: HashSet<Handle<naga::Function>>,
    queue: Vec<Handle<naga::Function>>,
    out: String,
}

/// One function's twin being written.
struct Twin<'a> {
    module: &'a Module,
    seed: Option<Handle<naga::Function>>,
    /// The generated names' prefix: every parameter, variable, value and derivative the twin
    /// writes is `{p}` and a letter or two and a number (`{p}a0`, `{p}dl3`, `{p}v12`).
    p: &'a str,
    f: &'a naga::Function,
    fi: &'a naga::valid::FunctionInfo,
    /// Expressions whose derivative is zero (or that have none).
    zero: HashSet<Handle<naga::Expression>>,
    /// Functions the twin calls the twins of.
    calls: Vec<Handle<naga::Function>>,
    /// The names of call results: `{p}r{n}`, a `vec2` for twins.
    results: HashMap<Handle<naga::Expression>, (String, bool)>,
    body: String,
}

/// The twin of the user's function `name`: `{p}d_{name}` seeded at the score, `{p}t_{name}`
/// at a captured tensor's read (`p` the generated names' prefix, which no name of the
/// snippet starts with).
fn twin_name(p: &str, seeded: bool, name: &str) -> String {
    let kind = if seeded { "t" } else { "d" };
    format!("{p}{kind}_{name}")
}

fn scalar_name(s: Scalar) -> Option<&'static str> {
    Some(match (s.kind, s.width) {
        (ScalarKind::Float, 4) => "f32",
        (ScalarKind::Uint, 4) => "u32",
        (ScalarKind::Sint, 4) => "i32",
        (ScalarKind::Bool, _) => "bool",
        _ => return None,
    })
}

fn is_f32(t: &TypeInner) -> bool {
    matches!(t, TypeInner::Scalar(Scalar::F32))
}

impl Deriver<'_> {
    fn twin(&mut self, fh: Handle<naga::Function>) -> std::result::Result<(), Fail> {
        let (module, info) = (self.module, self.info);
        let f = &module.functions[fh];
        let name = f.name.clone().unwrap_or_default();
        let ty = |h| &module.types[h].inner;
        // where the function is defined: its line, for the errors about its signature
        let defined = Some(module.functions.get_span(fh));
        if !f.result.as_ref().is_some_and(|r| is_f32(ty(r.ty))) {
            return Err((
                defined,
                format!("`{name}` must return f32 to be differentiated"),
            ));
        }
        let mut t = Twin {
            module,
            seed: self.seed,
            p: self.p,
            f,
            fi: &info[fh],
            zero: HashSet::new(),
            calls: Vec::new(),
            results: HashMap::new(),
            body: String::new(),
        };
        let mut params = Vec::new();
        for (k, a) in f.arguments.iter().enumerate() {
            let Some(n) = (match ty(a.ty) {
                TypeInner::Scalar(s) => scalar_name(*s),
                _ => None,
            }) else {
                let what = match ty(a.ty) {
                    TypeInner::Pointer { .. } => "a pointer",
                    _ => "not a scalar",
                };
                let arg = a.name.as_deref().unwrap_or("?");
                return Err((
                    defined,
                    format!("`{name}`'s argument `{arg}` is {what}, which is not differentiated"),
                ));
            };
            params.push(format!("{}a{k}: {n}", self.p));
            if n == "f32" {
                params.push(format!("{}da{k}: f32", self.p));
            }
        }
        for (lh, l) in f.local_variables.iter() {
            let span = Some(f.local_variables.get_span(lh));
            let Some(n) = (match ty(l.ty) {
                TypeInner::Scalar(s) => scalar_name(*s),
                _ => None,
            }) else {
                return Err((span, "only scalar variables are differentiated".into()));
            };
            let init = match l.init {
                Some(e) => t.value(e)?,
                None => format!("{n}()"),
            };
            let _ = writeln!(t.body, "    var {}l{}: {n} = {init};", t.p, lh.index());
            if n == "f32" {
                let _ = writeln!(t.body, "    var {}dl{}: f32 = 0.0;", t.p, lh.index());
            }
        }
        ir_walk::block(&mut t, &f.body, 1)?;
        let _ = writeln!(
            self.out,
            "fn {}({}) -> vec2<f32> {{\n{}}}",
            twin_name(self.p, self.seed.is_some(), &name),
            params.join(", "),
            t.body
        );
        self.queue.extend(t.calls);
        Ok(())
    }
}

impl Twin<'_> {
    fn ty(&self, e: Handle<naga::Expression>) -> &TypeInner {
        self.fi[e].ty.inner_with(&self.module.types)
    }

    fn span(&self, e: Handle<naga::Expression>) -> Option<naga::Span> {
        Some(self.f.expressions.get_span(e))
    }

    fn fail<T>(&self, e: Handle<naga::Expression>, msg: String) -> std::result::Result<T, Fail> {
        Err((self.span(e), msg))
    }

    /// The value of an expression as WGSL: its `let` where it was emitted, else its text.
    fn value(&self, e: Handle<naga::Expression>) -> std::result::Result<String, Fail> {
        Ok(match self.f.expressions[e] {
            E::Literal(l) => match l {
                Literal::F32(x) => format!("{x:?}f"),
                Literal::U32(x) => format!("{x}u"),
                Literal::I32(x) => format!("i32({x})"),
                Literal::Bool(x) => x.to_string(),
                Literal::AbstractFloat(x) => format!("{:?}f", x as f32),
                Literal::AbstractInt(x) => format!("{x}"),
                _ => return self.fail(e, "a literal of a type not differentiated".into()),
            },
            E::Constant(c) => match &self.module.constants[c].name {
                Some(n) => n.clone(),
                None => return self.fail(e, "an unnamed constant".into()),
            },
            E::FunctionArgument(k) => format!("{}a{k}", self.p),
            E::LocalVariable(l) => format!("{}l{}", self.p, l.index()),
            E::CallResult(_) => match self.results.get(&e) {
                Some((n, true)) => format!("{n}.x"),
                Some((n, false)) => n.clone(),
                None => return self.fail(e, "a call result before its call".into()),
            },
            E::ZeroValue(t) => match &self.module.types[t].inner {
                TypeInner::Scalar(s) if scalar_name(*s).is_some() => {
                    format!("{}()", scalar_name(*s).unwrap_or("f32"))
                }
                _ => return self.fail(e, "a zero value of a type not differentiated".into()),
            },
            _ => format!("{}v{}", self.p, e.index()),
        })
    }

    /// The derivative of an expression as WGSL ("0.0" where it is zero).
    fn deriv(&self, e: Handle<naga::Expression>) -> String {
        if self.zero.contains(&e) || !is_f32(self.ty(e)) {
            return "0.0".into();
        }
        match self.f.expressions[e] {
            E::Literal(_) | E::Constant(_) | E::ZeroValue(_) | E::Override(_) => "0.0".into(),
            E::FunctionArgument(k) => format!("{}da{k}", self.p),
            E::CallResult(_) => match self.results.get(&e) {
                Some((n, true)) => format!("{n}.y"),
                _ => "0.0".into(),
            },
            _ => format!("{}d{}", self.p, e.index()),
        }
    }

    fn is_zero(&self, e: Handle<naga::Expression>) -> bool {
        self.deriv(e) == "0.0"
    }

    /// `let v{e} = value;` and, for an f32 that depends on the score, `let d{e} = ...;`.
    fn emit(&mut self, e: Handle<naga::Expression>, pad: &str) -> std::result::Result<(), Fail> {
        let v = |h| self.value(h);
        let d = |h| self.deriv(h);
        let mine = format!("{}v{}", self.p, e.index());
        let (value, deriv): (String, Option<String>) = match self.f.expressions[e] {
            E::Load { pointer } => match self.f.expressions[pointer] {
                E::LocalVariable(l) => (
                    format!("{}l{}", self.p, l.index()),
                    Some(format!("{}dl{}", self.p, l.index())),
                ),
                _ => return self.fail(e, "only local variables are read through pointers".into()),
            },
            E::Unary { op, expr } => {
                let x = v(expr)?;
                match op {
                    U::Negate => (format!("-({x})"), Some(format!("-({})", d(expr)))),
                    U::LogicalNot => (format!("!({x})"), None),
                    U::BitwiseNot => (format!("~({x})"), None),
                }
            }
            E::Binary { op, left, right } => {
                let (a, b, da, db) = (v(left)?, v(right)?, d(left), d(right));
                let sym = ir_walk::symbol(op);
                let value = format!("({a}) {sym} ({b})");
                let deriv = match op {
                    B::Add => format!("({da}) + ({db})"),
                    B::Subtract => format!("({da}) - ({db})"),
                    B::Multiply => format!("({da}) * ({b}) + ({a}) * ({db})"),
                    B::Divide => format!("(({da}) - ({mine}) * ({db})) / ({b})"),
                    B::Modulo => format!("({da}) - ({db}) * trunc(({a}) / ({b}))"),
                    _ => "0.0".into(),
                };
                (value, Some(deriv))
            }
            E::Select {
                condition,
                accept,
                reject,
            } => (
                format!("select({}, {}, {})", v(reject)?, v(accept)?, v(condition)?),
                Some(format!(
                    "select({}, {}, {})",
                    d(reject),
                    d(accept),
                    v(condition)?
                )),
            ),
            E::As {
                expr,
                kind,
                convert,
            } => {
                let Some(to) = scalar_name(Scalar {
                    kind,
                    width: convert.unwrap_or(4),
                }) else {
                    return self.fail(e, "a conversion to a type not differentiated".into());
                };
                let x = v(expr)?;
                let value = match convert {
                    Some(_) => format!("{to}({x})"),
                    None => format!("bitcast<{to}>({x})"),
                };
                let same = convert.is_some() && is_f32(self.ty(expr));
                (value, Some(if same { d(expr) } else { "0.0".into() }))
            }
            E::Math {
                fun,
                arg,
                arg1,
                arg2,
                ..
            } => self.math(e, fun, arg, arg1, arg2)?,
            E::Access { base, index } if self.is_zero(base) => {
                (format!("{}[{}]", v(base)?, v(index)?), None)
            }
            E::AccessIndex { base, index } if self.is_zero(base) => {
                (format!("{}[{index}]", v(base)?), None)
            }
            E::Relational { fun, argument } => {
                let name = match fun {
                    naga::RelationalFunction::All => "all",
                    naga::RelationalFunction::Any => "any",
                    _ => return self.fail(e, "a relational function not differentiated".into()),
                };
                (format!("{name}({})", v(argument)?), None)
            }
            E::Literal(_)
            | E::Constant(_)
            | E::ZeroValue(_)
            | E::FunctionArgument(_)
            | E::LocalVariable(_)
            | E::CallResult(_) => return Ok(()),
            _ => {
                return self.fail(
                    e,
                    "an expression not differentiated here (vectors, matrices, arrays that \
                     depend on the score, structs, pointers, private or global variables)"
                        .into(),
                )
            }
        };
        if !matches!(
            self.ty(e),
            TypeInner::Scalar(s) if scalar_name(*s).is_some()
        ) {
            return self.fail(e, "only scalar expressions are differentiated".into());
        }
        let _ = writeln!(self.body, "{pad}let {mine} = {value};");
        // an expression of operands that do not depend on the score does not either (a
        // load may: its variable holds what was stored)
        let constant = match self.f.expressions[e] {
            E::Load { .. } => false,
            ref x => operands(x).iter().all(|&o| self.is_zero(o)),
        };
        match deriv {
            Some(d) if is_f32(self.ty(e)) && d != "0.0" && !constant => {
                let _ = writeln!(self.body, "{pad}let {}d{} = {d};", self.p, e.index());
            }
            _ => {
                self.zero.insert(e);
            }
        }
        Ok(())
    }

    /// A math function's value and derivative (see the module's list).
    #[allow(clippy::type_complexity)]
    fn math(
        &self,
        e: Handle<naga::Expression>,
        fun: M,
        arg: Handle<naga::Expression>,
        arg1: Option<Handle<naga::Expression>>,
        arg2: Option<Handle<naga::Expression>>,
    ) -> std::result::Result<(String, Option<String>), Fail> {
        let mine = format!("{}v{}", self.p, e.index());
        let x = self.value(arg)?;
        let dx = self.deriv(arg);
        let second = |h: Option<Handle<naga::Expression>>| -> std::result::Result<_, Fail> {
            match h {
                Some(h) => Ok((self.value(h)?, self.deriv(h), self.is_zero(h))),
                None => self.fail(e, "a math function without its arguments".into()),
            }
        };
        const LN2: &str = "0.6931471805599453";
        let one = |name: &str, d: String| Ok((format!("{name}({x})"), Some(d)));
        match fun {
            M::Abs => one("abs", format!("sign({x}) * ({dx})")),
            M::Sign | M::Floor | M::Ceil | M::Round | M::Trunc => {
                let name = match fun {
                    M::Sign => "sign",
                    M::Floor => "floor",
                    M::Ceil => "ceil",
                    M::Round => "round",
                    _ => "trunc",
                };
                Ok((format!("{name}({x})"), None))
            }
            M::Fract => one("fract", dx),
            M::Exp => one("exp", format!("{mine} * ({dx})")),
            M::Exp2 => one("exp2", format!("{mine} * {LN2} * ({dx})")),
            M::Log => one("log", format!("({dx}) / ({x})")),
            M::Log2 => one("log2", format!("({dx}) / (({x}) * {LN2})")),
            M::Sqrt => one("sqrt", format!("({dx}) / (2.0 * {mine})")),
            M::InverseSqrt => one("inverseSqrt", format!("-0.5 * {mine} / ({x}) * ({dx})")),
            M::Tanh => one("tanh", format!("(1.0 - {mine} * {mine}) * ({dx})")),
            M::Sin => one("sin", format!("cos({x}) * ({dx})")),
            M::Cos => one("cos", format!("-sin({x}) * ({dx})")),
            M::Tan => one("tan", format!("(1.0 + {mine} * {mine}) * ({dx})")),
            M::Atan => one("atan", format!("({dx}) / (1.0 + ({x}) * ({x}))")),
            M::Sinh => one("sinh", format!("cosh({x}) * ({dx})")),
            M::Cosh => one("cosh", format!("sinh({x}) * ({dx})")),
            M::Saturate => one(
                "saturate",
                format!("select(0.0, {dx}, ({x}) > 0.0 && ({x}) < 1.0)"),
            ),
            M::Min | M::Max => {
                let (y, dy, _) = second(arg1)?;
                let (name, cmp) = if fun == M::Min {
                    ("min", "<")
                } else {
                    ("max", ">")
                };
                Ok((
                    format!("{name}({x}, {y})"),
                    Some(format!("select({dy}, {dx}, ({x}) {cmp} ({y}))")),
                ))
            }
            M::Clamp => {
                let (lo, dlo, _) = second(arg1)?;
                let (hi, dhi, _) = second(arg2)?;
                Ok((
                    format!("clamp({x}, {lo}, {hi})"),
                    Some(format!(
                        "select(select({dx}, {dlo}, ({x}) < ({lo})), {dhi}, ({x}) > ({hi}))"
                    )),
                ))
            }
            M::Pow => {
                let (y, dy, const_exp) = second(arg1)?;
                let d = if const_exp {
                    format!("({y}) * pow({x}, ({y}) - 1.0) * ({dx})")
                } else {
                    format!("{mine} * (({dy}) * log({x}) + ({y}) * ({dx}) / ({x}))")
                };
                Ok((format!("pow({x}, {y})"), Some(d)))
            }
            M::Fma => {
                let (y, dy, _) = second(arg1)?;
                let (z, dz, _) = second(arg2)?;
                Ok((
                    format!("fma({x}, {y}, {z})"),
                    Some(format!("({dx}) * ({y}) + ({x}) * ({dy}) + ({dz})")),
                ))
            }
            M::Step => {
                let (y, _, _) = second(arg1)?;
                Ok((format!("step({x}, {y})"), None))
            }
            other => self.fail(
                e,
                format!("`{}` is not differentiated here", wgsl_math_name(other)),
            ),
        }
    }
}

/// A math function as WGSL spells it (naga's name with its first letter lowered, but
/// `smoothstep`), for errors in the user's words.
fn wgsl_math_name(fun: M) -> String {
    let name = format!("{fun:?}");
    if fun == M::SmoothStep {
        return "smoothstep".into();
    }
    let mut c = name.chars();
    c.next()
        .map(|f| f.to_lowercase().chain(c).collect())
        .unwrap_or_default()
}

impl ir_walk::Target for Twin<'_> {
    fn out(&mut self) -> &mut String {
        &mut self.body
    }

    fn expressions(&self) -> &naga::Arena<naga::Expression> {
        &self.f.expressions
    }

    fn value(&self, e: Handle<naga::Expression>) -> std::result::Result<String, Fail> {
        Twin::value(self, e)
    }

    fn emit(&mut self, e: Handle<naga::Expression>, pad: &str) -> std::result::Result<(), Fail> {
        Twin::emit(self, e, pad)
    }

    fn looped(
        &mut self,
        body: &naga::Block,
        continuing: &naga::Block,
        break_if: Option<Handle<naga::Expression>>,
        depth: usize,
    ) -> std::result::Result<(), Fail> {
        let pad = "    ".repeat(depth);
        let _ = writeln!(self.body, "{pad}loop {{");
        ir_walk::block(self, body, depth + 1)?;
        let _ = writeln!(self.body, "{pad}    continuing {{");
        ir_walk::block(self, continuing, depth + 2)?;
        if let Some(c) = break_if {
            let c = Twin::value(self, c)?;
            let _ = writeln!(self.body, "{pad}        break if {c};");
        }
        let _ = writeln!(self.body, "{pad}    }}");
        let _ = writeln!(self.body, "{pad}}}");
        Ok(())
    }

    fn ret(
        &mut self,
        value: Option<Handle<naga::Expression>>,
        pad: &str,
    ) -> std::result::Result<(), Fail> {
        let Some(v) = value else {
            return Err((None, "a return without a value".into()));
        };
        let (x, d) = (Twin::value(self, v)?, self.deriv(v));
        let _ = writeln!(self.body, "{pad}return vec2<f32>({x}, {d});");
        Ok(())
    }

    fn store(
        &mut self,
        l: Handle<naga::LocalVariable>,
        value: Handle<naga::Expression>,
        pad: &str,
    ) -> std::result::Result<(), Fail> {
        let x = Twin::value(self, value)?;
        let _ = writeln!(self.body, "{pad}{}l{} = {x};", self.p, l.index());
        if is_f32(self.ty(value)) {
            let d = self.deriv(value);
            let _ = writeln!(self.body, "{pad}{}dl{} = {d};", self.p, l.index());
        }
        Ok(())
    }

    fn call(
        &mut self,
        function: Handle<naga::Function>,
        arguments: &[Handle<naga::Expression>],
        result: Option<Handle<naga::Expression>>,
        pad: &str,
        span: naga::Span,
    ) -> std::result::Result<(), Fail> {
        let callee = &self.module.functions[function];
        let name = callee.name.clone().unwrap_or_default();
        // a helper that writes through a pointer (`ptr<function, f32>`) changes a variable
        // the twin cannot follow: refused here, at the call, before any code is written
        if arguments
            .iter()
            .any(|&a| matches!(self.ty(a), TypeInner::Pointer { .. }))
        {
            return Err((
                Some(span),
                format!("`{name}` takes a pointer, which is not differentiated"),
            ));
        }
        if Some(function) == self.seed {
            // the read the twins are seeded at (one, in score_mod: `one_read`): its value,
            // a derivative of 1, and its index kept for the gradient's kernel
            let (Some(r), [index]) = (result, arguments) else {
                return Err((None, format!("`{name}` is called without its index")));
            };
            let index = Twin::value(self, *index)?;
            let n = format!("{}r{}", self.p, r.index());
            let _ = writeln!(
                self.body,
                "{pad}let {n} = vec2<f32>({name}({index}), 1.0);\n{pad}score_mod__read = {index};"
            );
            self.results.insert(r, (n, true));
            return Ok(());
        }
        let returns_f32 = callee
            .result
            .as_ref()
            .is_some_and(|r| is_f32(&self.module.types[r.ty].inner));
        let depends = arguments.iter().any(|&a| !self.is_zero(a));
        // a result of integers or booleans is constant almost everywhere (derivative 0);
        // a vector, matrix, array or struct could carry the score's derivative, untracked
        let aggregate = callee
            .result
            .as_ref()
            .is_some_and(|r| !matches!(self.module.types[r.ty].inner, TypeInner::Scalar(_)));
        if depends && aggregate {
            return Err((
                Some(span),
                format!(
                    "`{name}` returns a vector, matrix, array or struct of the score; only \
                     scalar results are differentiated"
                ),
            ));
        }
        let twin = returns_f32 && depends;
        let mut args = Vec::new();
        for &a in arguments {
            args.push(Twin::value(self, a)?);
            if twin && is_f32(self.ty(a)) {
                args.push(self.deriv(a));
            }
        }
        let callee_name = if twin {
            self.calls.push(function);
            twin_name(self.p, self.seed.is_some(), &name)
        } else {
            name
        };
        match result {
            Some(r) => {
                let n = format!("{}r{}", self.p, r.index());
                let _ = writeln!(
                    self.body,
                    "{pad}let {n} = {callee_name}({});",
                    args.join(", ")
                );
                if !twin {
                    self.zero.insert(r);
                }
                self.results.insert(r, (n, twin));
            }
            None => {
                let _ = writeln!(self.body, "{pad}{callee_name}({});", args.join(", "));
            }
        }
        Ok(())
    }
}

/// The expressions an expression reads (those the twin differentiates).
fn operands(e: &naga::Expression) -> Vec<Handle<naga::Expression>> {
    match *e {
        E::Unary { expr, .. } | E::As { expr, .. } => vec![expr],
        E::Binary { left, right, .. } => vec![left, right],
        E::Select {
            condition,
            accept,
            reject,
        } => vec![condition, accept, reject],
        E::Math {
            arg,
            arg1,
            arg2,
            arg3,
            ..
        } => [Some(arg), arg1, arg2, arg3]
            .into_iter()
            .flatten()
            .collect(),
        E::Access { base, index } => vec![base, index],
        E::AccessIndex { base, .. } => vec![base],
        E::Relational { argument, .. } => vec![argument],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use naga::{Expression as E, Function, Statement as S};

    /// A value of the interpreter, in f64 where WGSL has f32.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum V {
        F(f64),
        U(u32),
        I(i32),
        B(bool),
        /// The twins' `vec2<f32>(value, derivative)`.
        F2(f64, f64),
    }

    impl V {
        fn f(self) -> f64 {
            match self {
                V::F(x) => x,
                other => panic!("not a float: {other:?}"),
            }
        }
    }

    enum Flow {
        Next,
        Break,
        Continue,
        Return(V),
    }

    /// A naga interpreter in f64 over what the derivation takes: the tests run the user's
    /// `score_mod` and the derived `score_mod_ds` through it, so that finite differences in
    /// f64 judge the derivation with no GPU.
    struct Run<'a> {
        m: &'a Module,
        /// The last value stored to a module-scope variable (`score_mod__read`).
        global: std::cell::Cell<Option<V>>,
    }

    impl<'a> Run<'a> {
        fn new(m: &'a Module) -> Run<'a> {
            Run {
                m,
                global: Default::default(),
            }
        }
    }

    struct Frame<'a> {
        f: &'a Function,
        args: Vec<V>,
        vals: HashMap<Handle<naga::Expression>, V>,
        locals: HashMap<Handle<naga::LocalVariable>, V>,
    }

    impl<'a> Run<'a> {
        fn call(&self, name: &str, args: &[V]) -> V {
            let (h, _) = self
                .m
                .functions
                .iter()
                .find(|(_, f)| f.name.as_deref() == Some(name))
                .unwrap();
            self.invoke(h, args.to_vec())
        }

        fn invoke(&self, h: Handle<Function>, args: Vec<V>) -> V {
            let f = &self.m.functions[h];
            let mut fr = Frame {
                f,
                args,
                vals: HashMap::new(),
                locals: HashMap::new(),
            };
            for (lh, l) in f.local_variables.iter() {
                let v = match l.init {
                    Some(e) => self.eval(&mut fr, e),
                    None => match self.m.types[l.ty].inner {
                        TypeInner::Scalar(Scalar::F32) => V::F(0.0),
                        TypeInner::Scalar(Scalar::U32) => V::U(0),
                        TypeInner::Scalar(Scalar::I32) => V::I(0),
                        _ => V::B(false),
                    },
                };
                fr.locals.insert(lh, v);
            }
            match self.block(&mut fr, &f.body) {
                Flow::Return(v) => v,
                _ => panic!("no return"),
            }
        }

        fn block(&self, fr: &mut Frame<'a>, b: &naga::Block) -> Flow {
            for st in b.iter() {
                let flow = match st {
                    S::Emit(r) => {
                        for e in r.clone() {
                            // afresh: a loop emits the same expressions each iteration
                            fr.vals.remove(&e);
                            let v = self.eval(fr, e);
                            fr.vals.insert(e, v);
                        }
                        Flow::Next
                    }
                    S::Block(inner) => self.block(fr, inner),
                    S::If {
                        condition,
                        accept,
                        reject,
                    } => {
                        if self.eval(fr, *condition) == V::B(true) {
                            self.block(fr, accept)
                        } else {
                            self.block(fr, reject)
                        }
                    }
                    S::Loop {
                        body,
                        continuing,
                        break_if,
                    } => loop {
                        match self.block(fr, body) {
                            Flow::Break => break Flow::Next,
                            Flow::Return(v) => break Flow::Return(v),
                            _ => {}
                        }
                        let _ = self.block(fr, continuing);
                        if break_if.is_some_and(|c| self.eval(fr, c) == V::B(true)) {
                            break Flow::Next;
                        }
                    },
                    S::Break => Flow::Break,
                    S::Continue => Flow::Continue,
                    S::Return { value } => Flow::Return(self.eval(fr, value.unwrap())),
                    S::Store { pointer, value } => {
                        let v = self.eval(fr, *value);
                        match fr.f.expressions[*pointer] {
                            E::LocalVariable(l) => {
                                fr.locals.insert(l, v);
                            }
                            E::GlobalVariable(_) => self.global.set(Some(v)),
                            _ => panic!("store"),
                        }
                        Flow::Next
                    }
                    S::Call {
                        function,
                        arguments,
                        result,
                    } => {
                        let args = arguments.iter().map(|&a| self.eval(fr, a)).collect();
                        let v = self.invoke(*function, args);
                        if let Some(r) = result {
                            fr.vals.insert(*r, v);
                        }
                        Flow::Next
                    }
                    other => panic!("{other:?}"),
                };
                if !matches!(flow, Flow::Next) {
                    return flow;
                }
            }
            Flow::Next
        }

        fn eval(&self, fr: &mut Frame<'a>, e: Handle<naga::Expression>) -> V {
            if let Some(v) = fr.vals.get(&e) {
                return *v;
            }
            let f = fr.f;
            let mut ev = |h| self.eval(fr, h);
            match f.expressions[e] {
                E::Literal(l) => lit(l),
                E::Constant(c) => match self.m.global_expressions[self.m.constants[c].init] {
                    E::Literal(l) => lit(l),
                    ref other => panic!("{other:?}"),
                },
                E::FunctionArgument(k) => fr.args[k as usize],
                E::Load { pointer } => match f.expressions[pointer] {
                    E::LocalVariable(l) => fr.locals[&l],
                    _ => panic!("load"),
                },
                E::Unary { op, expr } => match (op, ev(expr)) {
                    (U::Negate, V::F(x)) => V::F(-x),
                    (U::Negate, V::I(x)) => V::I(x.wrapping_neg()),
                    (U::LogicalNot, V::B(x)) => V::B(!x),
                    (U::BitwiseNot, V::U(x)) => V::U(!x),
                    other => panic!("{other:?}"),
                },
                E::Binary { op, left, right } => binary(op, ev(left), ev(right)),
                E::Select {
                    condition,
                    accept,
                    reject,
                } => {
                    let (c, a, r) = (ev(condition), ev(accept), ev(reject));
                    if c == V::B(true) {
                        a
                    } else {
                        r
                    }
                }
                E::As { expr, kind, .. } => match (kind, ev(expr)) {
                    (ScalarKind::Float, V::F(x)) => V::F(x),
                    (ScalarKind::Float, V::U(x)) => V::F(x as f64),
                    (ScalarKind::Float, V::I(x)) => V::F(x as f64),
                    (ScalarKind::Uint, V::F(x)) => V::U(x as u32),
                    (ScalarKind::Uint, V::I(x)) => V::U(x as u32),
                    (ScalarKind::Uint, V::U(x)) => V::U(x),
                    (ScalarKind::Sint, V::U(x)) => V::I(x as i32),
                    (ScalarKind::Sint, V::F(x)) => V::I(x as i32),
                    (ScalarKind::Sint, V::I(x)) => V::I(x),
                    other => panic!("{other:?}"),
                },
                E::Math {
                    fun,
                    arg,
                    arg1,
                    arg2,
                    ..
                } => {
                    let x = ev(arg);
                    let y = arg1.map(&mut ev);
                    let z = arg2.map(&mut ev);
                    math(fun, x, y, z)
                }
                E::CallResult(_) => fr.vals[&e],
                E::ZeroValue(t) => match self.m.types[t].inner {
                    TypeInner::Scalar(Scalar::F32) => V::F(0.0),
                    TypeInner::Scalar(Scalar::U32) => V::U(0),
                    TypeInner::Scalar(Scalar::I32) => V::I(0),
                    ref other => panic!("{other:?}"),
                },
                E::Compose { ref components, .. } => {
                    let c: Vec<f64> = components.clone().into_iter().map(|h| ev(h).f()).collect();
                    V::F2(c[0], c[1])
                }
                E::AccessIndex { base, index } => match ev(base) {
                    V::F2(x, y) => V::F([x, y][index as usize]),
                    other => panic!("{other:?}"),
                },
                ref other => panic!("{other:?}"),
            }
        }
    }

    fn lit(l: Literal) -> V {
        match l {
            Literal::F32(x) => V::F(x as f64),
            Literal::AbstractFloat(x) => V::F(x),
            Literal::U32(x) => V::U(x),
            Literal::I32(x) => V::I(x),
            Literal::AbstractInt(x) => V::I(x as i32),
            Literal::Bool(x) => V::B(x),
            other => panic!("{other:?}"),
        }
    }

    /// A comparison of two values of one ordered kind, or None for another operator.
    fn compare<T: PartialOrd>(op: B, x: T, y: T) -> Option<bool> {
        Some(match op {
            B::Less => x < y,
            B::LessEqual => x <= y,
            B::Greater => x > y,
            B::GreaterEqual => x >= y,
            B::Equal => x == y,
            B::NotEqual => x != y,
            _ => return None,
        })
    }

    fn binary(op: B, a: V, b: V) -> V {
        let cmp = match (a, b) {
            (V::F(x), V::F(y)) => compare(op, x, y),
            (V::U(x), V::U(y)) => compare(op, x, y),
            (V::I(x), V::I(y)) => compare(op, x, y),
            (V::B(x), V::B(y)) => compare(op, x, y),
            _ => None,
        };
        if let Some(c) = cmp {
            return V::B(c);
        }
        match (a, b) {
            (V::F(x), V::F(y)) => match op {
                B::Add => V::F(x + y),
                B::Subtract => V::F(x - y),
                B::Multiply => V::F(x * y),
                B::Divide => V::F(x / y),
                B::Modulo => V::F(x % y),
                other => panic!("{other:?}"),
            },
            (V::U(x), V::U(y)) => match op {
                B::Add => V::U(x.wrapping_add(y)),
                B::Subtract => V::U(x.wrapping_sub(y)),
                B::Multiply => V::U(x.wrapping_mul(y)),
                B::Divide => V::U(x.checked_div(y).unwrap_or(x)),
                B::Modulo => V::U(x.checked_rem(y).unwrap_or(0)),
                other => panic!("{other:?}"),
            },
            (V::I(x), V::I(y)) => match op {
                B::Add => V::I(x.wrapping_add(y)),
                B::Subtract => V::I(x.wrapping_sub(y)),
                B::Multiply => V::I(x.wrapping_mul(y)),
                other => panic!("{other:?}"),
            },
            (V::B(x), V::B(y)) => match op {
                B::LogicalAnd | B::And => V::B(x && y),
                B::LogicalOr | B::InclusiveOr => V::B(x || y),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    fn math(fun: M, x: V, y: Option<V>, z: Option<V>) -> V {
        // integers: what index arithmetic uses
        match (fun, x, y) {
            (M::Abs, V::I(a), _) => return V::I(a.wrapping_abs()),
            (M::Min, V::I(a), Some(V::I(b))) => return V::I(a.min(b)),
            (M::Max, V::I(a), Some(V::I(b))) => return V::I(a.max(b)),
            (M::Min, V::U(a), Some(V::U(b))) => return V::U(a.min(b)),
            (M::Max, V::U(a), Some(V::U(b))) => return V::U(a.max(b)),
            _ => {}
        }
        let (a, b, c) = (x.f(), y.map(V::f), z.map(V::f));
        V::F(match fun {
            M::Abs => a.abs(),
            M::Min => a.min(b.unwrap()),
            M::Max => a.max(b.unwrap()),
            M::Clamp => a.max(b.unwrap()).min(c.unwrap()),
            M::Sign => {
                if a > 0.0 {
                    1.0
                } else if a < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            M::Floor => a.floor(),
            M::Ceil => a.ceil(),
            M::Round => a.round_ties_even(),
            M::Trunc => a.trunc(),
            M::Fract => a - a.floor(),
            M::Exp => a.exp(),
            M::Exp2 => a.exp2(),
            M::Log => a.ln(),
            M::Log2 => a.log2(),
            M::Sqrt => a.sqrt(),
            M::InverseSqrt => 1.0 / a.sqrt(),
            M::Pow => a.powf(b.unwrap()),
            M::Tanh => a.tanh(),
            M::Sin => a.sin(),
            M::Cos => a.cos(),
            M::Tan => a.tan(),
            M::Atan => a.atan(),
            M::Sinh => a.sinh(),
            M::Cosh => a.cosh(),
            M::Saturate => a.clamp(0.0, 1.0),
            M::Fma => a * b.unwrap() + c.unwrap(),
            M::Step => (b.unwrap() >= a) as u32 as f64,
            other => panic!("{other:?}"),
        })
    }

    /// The snippet with its derived `score_mod_ds`, parsed.
    fn derived(source: &str) -> Module {
        let ds = score_mod_ds(source, "").unwrap_or_else(|e| panic!("{e}\n{source}"));
        let whole = format!("{source}\n{ds}");
        naga::front::wgsl::parse_str(&whole).unwrap_or_else(|e| panic!("{e}\n{whole}"))
    }

    /// Central differences in f64 where both one-sided ones agree (no kink between), against
    /// the derived derivative; returns the points compared.
    fn agrees(source: &str, points: &[(f64, u32, u32)]) -> usize {
        let m = derived(source);
        let run = Run::new(&m);
        let f = |s: f64, i, j| {
            run.call("score_mod", &[V::F(s), V::U(0), V::U(1), V::U(i), V::U(j)])
                .f()
        };
        let mut compared = 0;
        for &(s, i, j) in points {
            let h = 1e-6 * (1.0 + s.abs());
            let (lo, mid, hi) = (f(s - h, i, j), f(s, i, j), f(s + h, i, j));
            let (left, right) = ((mid - lo) / h, (hi - mid) / h);
            let scale = 1.0 + left.abs().max(right.abs());
            if (left - right).abs() > 1e-3 * scale || !mid.is_finite() {
                continue; // a kink (or a jump) within h
            }
            let fd = (hi - lo) / (2.0 * h);
            let ad = run
                .call(
                    "score_mod_ds",
                    &[V::F(s), V::U(0), V::U(1), V::U(i), V::U(j)],
                )
                .f();
            assert!(
                (ad - fd).abs() <= 1e-5 * scale,
                "d/ds at s = {s}, i = {i}, j = {j}: derived {ad}, finite differences {fd}\n{source}"
            );
            compared += 1;
        }
        compared
    }

    /// A random expression of the score `s` (f32) and the indices (u32) over the constructs
    /// the derivation takes, kept finite (arguments of log, sqrt, pow and division positive).
    fn expr(r: &mut dyn FnMut() -> u64, depth: u32) -> String {
        let leaf = |r: &mut dyn FnMut() -> u64| match r() % 5 {
            0 | 1 => "s".to_string(),
            2 => format!("{}.{}", r() % 3, r() % 10),
            3 => "f32(i) * 0.1".into(),
            _ => "t".into(), // a variable of the snippet
        };
        if depth == 0 {
            return leaf(&mut *r);
        }
        let sub = |r: &mut dyn FnMut() -> u64| expr(r, depth - 1);
        let a = sub(&mut *r);
        let b = sub(&mut *r);
        match r() % 22 {
            0 => format!("({a} + {b})"),
            1 => format!("({a} - {b})"),
            2 | 3 => format!("({a} * {b})"),
            4 => format!("({a} / (1.5 + abs({b})))"),
            5 => format!("select({a}, {b}, {a} < {b} * 0.5)"),
            6 => format!("abs({a})"),
            7 => format!("min({a}, {b})"),
            8 => format!("max({a}, {b})"),
            9 => format!("clamp({a}, -1.5, 2.0)"),
            10 => format!("exp(clamp({a}, -3.0, 3.0))"),
            11 => format!("exp2(clamp({a}, -3.0, 3.0))"),
            12 => format!("log(1.0 + abs({a}))"),
            13 => format!("log2(2.0 + {a} * {a})"),
            14 => format!("sqrt(1.0 + abs({a}))"),
            15 => format!("inverseSqrt(1.0 + {a} * {a})"),
            16 => format!("pow(1.0 + abs({a}), 1.5)"),
            17 => format!("tanh({a})"),
            18 => format!("sin({a})"),
            19 => format!("cos({a})"),
            20 => format!("helper({a}, j)"),
            _ => format!("(sign({a}) + {b})"),
        }
    }

    #[test]
    fn derived_derivatives_equal_finite_differences_on_random_snippets() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
        let mut r = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut compared = 0;
        for n in 0..60 {
            let (e1, e2, e3) = (expr(&mut r, 3), expr(&mut r, 2), expr(&mut r, 2));
            // let and var, if/else, a bounded loop and a helper that depends on the score
            let source = format!(
                "fn helper(x: f32, k: u32) -> f32 {{
    if (k % 2u == 0u) {{
        return x * 0.5 + f32(k) * 0.01;
    }}
    return tanh(x) - 0.25;
}}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{
    var t = s * 0.75;
    let u = {e2};
    if (u > 0.3) {{
        t = t + {e3};
    }} else {{
        t = t * 0.5;
    }}
    for (var k = 0u; k < (i % 3u); k = k + 1u) {{
        t = t + 0.1 * u;
    }}
    return {e1};
}}"
            );
            let points: Vec<(f64, u32, u32)> = (0..8)
                .map(|_| {
                    let s = (r() % 4001) as f64 / 1000.0 - 2.0;
                    (s, (r() % 7) as u32, (r() % 5) as u32)
                })
                .collect();
            compared += agrees(&source, &points);
            assert!(n < 59 || compared > 300, "only {compared} points compared");
        }
    }

    #[test]
    fn the_derivation_equals_the_hand_written_derivatives_of_the_tests() {
        // softcap, T5-style buckets (a table read: derivative 1), ALiBi by distance
        let cases = [
            (
                "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 2.0 * tanh(s / 2.0); }",
                "fn hand(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { let t = tanh(s / 2.0); return 1.0 - t * t; }",
            ),
            (
                "fn t(k: u32) -> f32 { return f32(k) * 0.125; }
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + t(h * 8u + u32(min(abs(i32(j) - i32(i)), 7))); }",
                "fn hand(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }",
            ),
            (
                "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s - 0.25 * f32(h + 1u) * abs(f32(i) - f32(j)); }",
                "fn hand(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }",
            ),
        ];
        for (source, hand) in cases {
            let m = derived(&format!("{source}\n{hand}"));
            let run = Run::new(&m);
            for (s, i, j) in [(-1.3, 4, 1), (0.2, 0, 6), (2.5, 9, 9)] {
                let args = [V::F(s), V::U(0), V::U(1), V::U(i), V::U(j)];
                let (ad, want) = (run.call("score_mod_ds", &args), run.call("hand", &args));
                assert!(
                    (ad.f() - want.f()).abs() < 1e-12,
                    "{source}: {ad:?} vs {want:?}"
                );
            }
        }
    }

    /// The names the derivation wrote for `source` (seeded at the score, or at captured
    /// tensor `tensor`'s read, with `stubs` its accessors): every name the derived code
    /// declares (functions, arguments, variables, `let`s), as naga reads them.
    fn generated_names(source: &str, stubs: &str, tensor: Option<&str>) -> Vec<String> {
        let derived = match tensor {
            None => score_mod_ds(source, stubs),
            Some(t) => score_mod_dt(source, stubs, t),
        }
        .unwrap_or_else(|e| panic!("{e}\n{source}"));
        let whole = format!("{source}\n{stubs}\n{derived}");
        let m = naga::front::wgsl::parse_str(&whole).unwrap_or_else(|e| panic!("{e}\n{whole}"));
        let from_source = naga::front::wgsl::parse_str(&format!("{source}\n{stubs}")).unwrap();
        let user_fns: HashSet<String> = from_source
            .functions
            .iter()
            .filter_map(|(_, f)| f.name.clone())
            .collect();
        let mut names = Vec::new();
        for (_, f) in m.functions.iter() {
            let name = f.name.clone().unwrap_or_default();
            if user_fns.contains(&name) {
                continue;
            }
            if !["score_mod_ds", "score_mod_dt"].contains(&name.as_str()) {
                names.push(name);
            }
            names.extend(f.arguments.iter().filter_map(|a| a.name.clone()));
            names.extend(f.local_variables.iter().filter_map(|(_, l)| l.name.clone()));
            names.extend(f.named_expressions.values().cloned());
        }
        names.sort();
        names.dedup();
        names
    }

    /// `base` with every name in `names` declared by the user at module scope and read in
    /// `score_mod`'s own body (where its twin's generated locals live): the twins' names as
    /// helpers, the rest as constants; each moves the result by a small, different amount.
    fn declaring(base: &str, names: &[String]) -> String {
        let (mut decls, mut terms) = (String::new(), Vec::new());
        for (k, n) in names.iter().enumerate() {
            let c = 0.001 * (k + 1) as f64;
            if n.contains("__") || n.starts_with("gen_d_") || n.starts_with("gen_t_") {
                decls.push_str(&format!("fn {n}(x: f32) -> f32 {{ return x * {c:?}; }}\n"));
                terms.push(format!("{n}(s)"));
            } else {
                decls.push_str(&format!("const {n}: f32 = {c:?};\n"));
                terms.push(format!("{n} * s"));
            }
        }
        base.replace("/*USER*/", &format!("+ {}", terms.join(" + "))) + "\n" + &decls
    }

    /// A snippet whose derivation writes every kind of name: twins of helpers, arguments
    /// (f32 and u32), variables (f32 and u32), values, derivatives and call results.
    const EVERY_KIND: &str = "fn u_lin(x: f32, k: u32) -> f32 {
    var acc = x;
    for (var n = 0u; n < k % 3u; n++) {
        acc = acc * 0.75 + 0.125;
    }
    return acc - 0.25 * x * x;
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let t = u_lin(s, i + j) - 0.25 * tanh(s);
    return t * f32(h + 1u) /*USER*/;
}";

    #[test]
    fn no_name_a_snippet_declares_reaches_the_derived_code() {
        // what the derivation writes for the snippet alone, and the names it wrote before
        // (issue 61: `a0`.., `da0`.., `v{n}`, `d{n}`, `l{n}`, `dl{n}`, `r{n}`, `{name}__d`)
        let base = EVERY_KIND.replace("/*USER*/", "");
        let mut names = generated_names(&base, "", None);
        assert!(
            names.iter().any(|n| n.starts_with("gen_d_")) && names.len() > 20,
            "{names:?}"
        );
        for old in [
            "a0",
            "a1",
            "da0",
            "v3",
            "d3",
            "l0",
            "dl0",
            "l1",
            "r7",
            "u_lin__d",
            "score_mod__d",
        ] {
            names.push(old.to_string());
        }
        let source = declaring(EVERY_KIND, &names);
        // every one is the user's: the derivation's names are apart from them
        let again = generated_names(&source, "", None);
        let users: HashSet<&str> = names::identifiers(&source).into_iter().collect();
        assert!(again.iter().all(|n| !users.contains(n.as_str())));
        assert!(again.iter().all(|n| n.starts_with("gen1_")), "{again:?}");
        // and the derivative is the function's
        let points: Vec<(f64, u32, u32)> = (0..24)
            .map(|k| (-2.0 + 0.17 * k as f64, k % 5, (k * 7) % 4))
            .collect();
        assert!(agrees(&source, &points) >= 20);
    }

    #[test]
    fn the_issues_snippet_that_declares_a0_is_differentiated_right() {
        // issue 61: the twin named its first argument `a0` and read the user's constant as it
        let source = "const a0: f32 = 0.75;
fn u_lin(x: f32) -> f32 { return a0 * x - 0.25 * x * x; }
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return u_lin(s) - 0.25 * tanh(s); }";
        let m = derived(source);
        let run = Run::new(&m);
        for s in [-1.5, -0.2, 0.4, 2.0] {
            let args = [V::F(s), V::U(0), V::U(1), V::U(2), V::U(3)];
            let want = 0.75 - 0.5 * s - 0.25 * (1.0 - s.tanh().powi(2));
            let got = run.call("score_mod_ds", &args).f();
            assert!((got - want).abs() < 1e-12, "at {s}: {got} vs {want}");
        }
        // `a1` was refused for code the user never wrote
        assert!(score_mod_ds(&source.replace("a0", "a1"), "").is_ok());
    }

    #[test]
    fn no_name_a_snippet_declares_reaches_the_trainable_partial() {
        // d score_mod / d tab(h) = u_lin(s, i + j): the twins seeded at the read, with every
        // name the partial's derivation writes declared by the user
        let stubs = "fn tab(k: u32) -> f32 { return 0.5 + 0.25 * f32(k); }";
        let base = EVERY_KIND
            .replace("t * f32(h + 1u)", "u_lin(s, i + j) * tab(h) + t")
            .replace("/*USER*/", "");
        let mut names = generated_names(&base, stubs, Some("tab"));
        assert!(names.iter().any(|n| n.starts_with("gen_t_")), "{names:?}");
        names.extend(["a0", "v5", "r3", "u_lin__t", "score_mod__t"].map(String::from));
        let source = declaring(
            &EVERY_KIND.replace("t * f32(h + 1u)", "u_lin(s, i + j) * tab(h) + t"),
            &names,
        );
        let dt = score_mod_dt(&source, stubs, "tab").unwrap();
        let users: HashSet<&str> = names::identifiers(&source).into_iter().collect();
        let whole = format!("{source}\n{stubs}\n{dt}");
        let m = naga::front::wgsl::parse_str(&whole).unwrap_or_else(|e| panic!("{e}\n{whole}"));
        let run = Run::new(&m);
        for (s, h, i, j) in [(-1.2, 0, 1, 2), (0.3, 2, 4, 0), (1.7, 1, 2, 2)] {
            let args = [V::F(s), V::U(0), V::U(h), V::U(i), V::U(j)];
            let got = run.call("score_mod_dt", &args).f();
            let want = run.call("u_lin", &[V::F(s), V::U(i + j)]).f();
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
            assert_eq!(run.global.get(), Some(V::U(h)), "the entry read");
        }
        assert!(generated_names(&source, stubs, Some("tab"))
            .iter()
            .all(|n| !users.contains(n.as_str())));
    }

    #[test]
    fn what_the_derivation_refuses_it_names_at_the_users_line_before_any_code() {
        let refused = |source: &str, line: usize, words: &[&str]| {
            let e = score_mod_ds(source, "").unwrap_err();
            let crate::Error::UserCode {
                line: at, message, ..
            } = &e
            else {
                panic!("{e:?}")
            };
            assert_eq!(*at, Some(line), "{e}");
            for w in words {
                assert!(message.contains(w), "{w}: {e}");
            }
            assert!(
                !message.contains("gen_") && !message.contains("invalid"),
                "{e}"
            );
        };
        // a helper that writes through a pointer (issue 61's 8-line snippet)
        refused(
            "fn add(p: ptr<function, f32>, x: f32) {
    *p = *p + x;
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    var t = s;
    add(&t, 0.5 * s);
    return t;
}",
            6,
            &["`add`", "pointer"],
        );
        // a helper that takes one and returns f32
        refused(
            "fn read_twice(p: ptr<function, f32>) -> f32 {
    return *p * 2.0;
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    var t = s;
    return read_twice(&t);
}",
            6,
            &["`read_twice`", "pointer"],
        );
        // a module-scope private variable: the snippet may declare one, the derivation
        // does not follow it
        refused(
            "var<private> k: f32;
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    k = 2.0 * s;
    return k;
}",
            3,
            &["store"],
        );
        // the math functions outside the list, by their WGSL names
        for (call, name) in [
            ("atan2(s, 2.0)", "atan2"),
            ("mix(s, 1.0, 0.25)", "mix"),
            ("asinh(s)", "asinh"),
            ("smoothstep(0.0, 1.0, s)", "smoothstep"),
        ] {
            refused(
                &format!(
                    "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{\n    \
                     return {call};\n}}"
                ),
                2,
                &[&format!("`{name}`")],
            );
        }
        // a helper of the score that returns a vector (its derivative would be lost)
        refused(
            "fn both(x: f32) -> vec2<f32> {
    return vec2<f32>(x, x * x);
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return both(s).y;
}",
            5,
            &["`both`", "vector"],
        );
        // a helper of the score returning f32 whose argument is a vector
        refused(
            "fn first(v: vec2<f32>) -> f32 {
    return v.x;
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return first(vec2<f32>(s, 1.0));
}",
            5,
            &["vectors"],
        );
    }
}
