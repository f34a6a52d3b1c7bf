//! A user snippet's WGSL as CUDA C, from naga's IR, so that the same `score_mod` or
//! `mask_mod` (its derived derivative included: plain WGSL functions by then) runs on the
//! CUDA backend without `with_cuda`. Every function of the snippet becomes a `__device__`
//! function of the same name and signature (prototypes first: WGSL may call a function
//! defined below); each expression a `const` of its type; variables, `if`, loops, `break`,
//! `continue` and `return` keep their shape; math functions map to CUDA's float ones. The
//! captured tensors' accessors are the kernels' own (`float name(unsigned int)`), so the
//! stand-ins the parse needs are left out. The names the translation writes itself (arguments,
//! variables, values, loop flags) begin with a prefix that begins no name of the snippet
//! (`names::fresh_prefix`), so none can hide a function or constant of the user's.
//!
//! The subset is the derivation's (src/modifiers/derive.rs) plus `vec2<f32>` (the twins'
//! `float2`). What falls outside is an error message: the modifier then has no CUDA C and
//! the CUDA backend refuses it with that reason (give `with_cuda`).

use std::fmt::Write;

use naga::{
    BinaryOperator as B, Expression as E, Handle, Literal, MathFunction as M, Module, Scalar,
    ScalarKind, TypeInner, UnaryOperator as U, VectorSize,
};

/// The CUDA C of `source` (with `stubs`, the captured tensors' stand-ins named `captured`,
/// after it for the parse), or why not.
pub(crate) fn translate(source: &str, stubs: &str, captured: &[&str]) -> Result<String, String> {
    let whole = format!("{source}\n{stubs}");
    let module = naga::front::wgsl::parse_str(&whole).map_err(|e| e.message().to_string())?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .map_err(|e| e.as_inner().to_string())?;
    let line = |span: naga::Span| span.location(&whole).line_number;
    let p = super::names::fresh_prefix(&[source, stubs]);
    let mut protos = String::new();
    let mut bodies = String::new();
    for (fh, f) in module.functions.iter() {
        let name = f.name.clone().unwrap_or_default();
        if captured.contains(&name.as_str()) {
            continue;
        }
        let mut c = Cuda {
            module: &module,
            p: &p,
            f,
            fi: &info[fh],
            out: String::new(),
        };
        let head = c.head(&name).map_err(|(s, m)| at(s.map(line), m))?;
        let _ = writeln!(protos, "{head};");
        c.locals().map_err(|(s, m)| at(s.map(line), m))?;
        ir_walk::block(&mut c, &f.body, 1).map_err(|(s, m)| at(s.map(line), m))?;
        let _ = writeln!(bodies, "{head} {{\n{}}}", c.out);
    }
    Ok(format!(
        "// translated from the WGSL (src/modifiers/to_cuda.rs)\n{protos}{bodies}"
    ))
}

fn at(line: Option<u32>, msg: String) -> String {
    match line {
        Some(l) => format!("line {l}: {msg}"),
        None => msg,
    }
}

use super::ir_walk::{self, Fail};

struct Cuda<'a> {
    module: &'a Module,
    /// The prefix of every name the translation writes (`names::fresh_prefix`: no name
    /// of the snippet begins with it): `{p}a0` an argument, `{p}l1` a variable, `{p}v2` a
    /// value, `{p}first3` a loop's first pass.
    p: &'a str,
    f: &'a naga::Function,
    fi: &'a naga::valid::FunctionInfo,
    out: String,
}

fn type_name(t: &TypeInner) -> Option<&'static str> {
    Some(match t {
        TypeInner::Scalar(Scalar::F32) => "float",
        TypeInner::Scalar(Scalar::U32) => "unsigned int",
        TypeInner::Scalar(Scalar::I32) => "int",
        TypeInner::Scalar(s) if s.kind == ScalarKind::Bool => "bool",
        TypeInner::Vector {
            size: VectorSize::Bi,
            scalar: Scalar::F32,
        } => "float2",
        _ => return None,
    })
}

impl Cuda<'_> {
    fn ty(&self, e: Handle<naga::Expression>) -> &TypeInner {
        self.fi[e].ty.inner_with(&self.module.types)
    }

    fn fail<T>(&self, e: Handle<naga::Expression>, msg: &str) -> Result<T, Fail> {
        Err((Some(self.f.expressions.get_span(e)), msg.to_string()))
    }

    fn head(&self, name: &str) -> Result<String, Fail> {
        let of = |t| type_name(&self.module.types[t].inner);
        let ret = match &self.f.result {
            Some(r) => of(r.ty).ok_or((None, format!("`{name}` returns a type not translated")))?,
            None => "void",
        };
        let mut params = Vec::new();
        for (k, a) in self.f.arguments.iter().enumerate() {
            let t = of(a.ty).ok_or((
                None,
                format!("`{name}`'s argument {k}: a type not translated"),
            ))?;
            params.push(format!("{t} {}a{k}", self.p));
        }
        Ok(format!(
            "__device__ __forceinline__ {ret} {name}({})",
            params.join(", ")
        ))
    }

    fn locals(&mut self) -> Result<(), Fail> {
        for (lh, l) in self.f.local_variables.iter() {
            let span = Some(self.f.local_variables.get_span(lh));
            let t = type_name(&self.module.types[l.ty].inner)
                .ok_or((span, "a variable of a type not translated".to_string()))?;
            let init = match l.init {
                Some(e) => self.value(e)?,
                None => format!("{t}()"),
            };
            let _ = writeln!(self.out, "    {t} {}l{} = {init};", self.p, lh.index());
        }
        Ok(())
    }

    fn value(&self, e: Handle<naga::Expression>) -> Result<String, Fail> {
        Ok(match self.f.expressions[e] {
            E::Literal(l) => literal(l)
                .ok_or(())
                .or_else(|_| self.fail(e, "a literal not translated"))?,
            E::Constant(c) => match self.module.global_expressions[self.module.constants[c].init] {
                E::Literal(l) => literal(l)
                    .ok_or(())
                    .or_else(|_| self.fail(e, "a constant not translated"))?,
                _ => return self.fail(e, "a constant other than a number"),
            },
            E::FunctionArgument(k) => format!("{}a{k}", self.p),
            E::LocalVariable(l) => format!("{}l{}", self.p, l.index()),
            E::ZeroValue(t) => match type_name(&self.module.types[t].inner) {
                Some("float2") => "make_float2(0.f, 0.f)".into(),
                Some(t) => format!("({t})0"),
                None => return self.fail(e, "a zero value not translated"),
            },
            _ => format!("{}v{}", self.p, e.index()),
        })
    }

    fn emit(&mut self, e: Handle<naga::Expression>, pad: &str) -> Result<(), Fail> {
        let v = |h| self.value(h);
        let float = |h| matches!(self.ty(h), TypeInner::Scalar(Scalar::F32));
        let text = match self.f.expressions[e] {
            E::Load { pointer } => match self.f.expressions[pointer] {
                E::LocalVariable(l) => format!("{}l{}", self.p, l.index()),
                _ => return self.fail(e, "a read through a pointer other than a variable"),
            },
            E::Unary { op, expr } => {
                let sym = match op {
                    U::Negate => "-",
                    U::LogicalNot => "!",
                    U::BitwiseNot => "~",
                };
                format!("{sym}({})", v(expr)?)
            }
            E::Binary { op, left, right } => {
                let (a, b) = (v(left)?, v(right)?);
                match op {
                    B::Modulo if float(left) => format!("fmodf({a}, {b})"),
                    // WGSL takes the shift amount modulo the width
                    B::ShiftLeft => format!("({a}) << (({b}) & 31u)"),
                    B::ShiftRight => format!("({a}) >> (({b}) & 31u)"),
                    _ => {
                        let sym = ir_walk::symbol(op);
                        format!("({a}) {sym} ({b})")
                    }
                }
            }
            E::Select {
                condition,
                accept,
                reject,
            } => format!(
                "(({}) ? ({}) : ({}))",
                v(condition)?,
                v(accept)?,
                v(reject)?
            ),
            E::As {
                expr,
                kind,
                convert,
            } => {
                let from_float = float(expr);
                let x = v(expr)?;
                match (kind, convert, from_float) {
                    (ScalarKind::Float, Some(_), _) => format!("(float)({x})"),
                    (ScalarKind::Uint, Some(_), true) => format!("__float2uint_rz({x})"),
                    (ScalarKind::Sint, Some(_), true) => format!("__float2int_rz({x})"),
                    (ScalarKind::Uint, Some(_), false) => format!("(unsigned int)({x})"),
                    (ScalarKind::Sint, Some(_), false) => format!("(int)({x})"),
                    (ScalarKind::Bool, Some(_), _) => format!("(bool)({x})"),
                    (ScalarKind::Float, None, false) => match self.ty(expr) {
                        TypeInner::Scalar(Scalar::I32) => format!("__int_as_float({x})"),
                        _ => format!("__uint_as_float({x})"),
                    },
                    (ScalarKind::Uint, None, true) => format!("__float_as_uint({x})"),
                    (ScalarKind::Sint, None, true) => format!("__float_as_int({x})"),
                    (ScalarKind::Uint, None, false) => format!("(unsigned int)({x})"),
                    (ScalarKind::Sint, None, false) => format!("(int)({x})"),
                    _ => return self.fail(e, "a conversion not translated"),
                }
            }
            E::Math {
                fun,
                arg,
                arg1,
                arg2,
                ..
            } => {
                let x = v(arg)?;
                let y = arg1.map(v).transpose()?;
                let z = arg2.map(v).transpose()?;
                let (y, z) = (y.unwrap_or_default(), z.unwrap_or_default());
                if float(arg) {
                    match fun {
                        M::Abs => format!("fabsf({x})"),
                        M::Min => format!("fminf({x}, {y})"),
                        M::Max => format!("fmaxf({x}, {y})"),
                        M::Clamp => format!("fminf(fmaxf({x}, {y}), {z})"),
                        M::Saturate => format!("fminf(fmaxf({x}, 0.f), 1.f)"),
                        M::Sign => format!("(({x}) > 0.f ? 1.f : (({x}) < 0.f ? -1.f : 0.f))"),
                        M::Floor => format!("floorf({x})"),
                        M::Ceil => format!("ceilf({x})"),
                        M::Round => format!("rintf({x})"),
                        M::Trunc => format!("truncf({x})"),
                        M::Fract => format!("(({x}) - floorf({x}))"),
                        M::Exp => format!("expf({x})"),
                        M::Exp2 => format!("exp2f({x})"),
                        M::Log => format!("logf({x})"),
                        M::Log2 => format!("log2f({x})"),
                        M::Sqrt => format!("sqrtf({x})"),
                        M::InverseSqrt => format!("rsqrtf({x})"),
                        M::Pow => format!("powf({x}, {y})"),
                        M::Tanh => format!("tanhf({x})"),
                        M::Sin => format!("sinf({x})"),
                        M::Cos => format!("cosf({x})"),
                        M::Tan => format!("tanf({x})"),
                        M::Atan => format!("atanf({x})"),
                        M::Sinh => format!("sinhf({x})"),
                        M::Cosh => format!("coshf({x})"),
                        M::Fma => format!("fmaf({x}, {y}, {z})"),
                        M::Step => format!("(({y}) >= ({x}) ? 1.f : 0.f)"),
                        _ => return self.fail(e, &format!("`{fun:?}` is not translated")),
                    }
                } else {
                    match fun {
                        M::Abs => format!("abs({x})"),
                        M::Min => format!("min({x}, {y})"),
                        M::Max => format!("max({x}, {y})"),
                        M::Clamp => format!("min(max({x}, {y}), {z})"),
                        _ => {
                            return self
                                .fail(e, &format!("`{fun:?}` of integers is not translated"))
                        }
                    }
                }
            }
            E::Compose { ref components, .. } if components.len() == 2 => {
                format!("make_float2({}, {})", v(components[0])?, v(components[1])?)
            }
            E::AccessIndex { base, index } if type_name(self.ty(base)) == Some("float2") => {
                format!("({}).{}", v(base)?, ["x", "y"][index as usize % 2])
            }
            E::Relational { .. } => return self.fail(e, "`all` and `any` are not translated"),
            E::Literal(_)
            | E::Constant(_)
            | E::ZeroValue(_)
            | E::FunctionArgument(_)
            | E::LocalVariable(_)
            | E::CallResult(_) => return Ok(()),
            _ => {
                return self.fail(
                    e,
                    "an expression not translated (arrays, structs, pointers)",
                )
            }
        };
        let t = type_name(self.ty(e)).map_or_else(|| self.fail(e, "a type not translated"), Ok)?;
        let _ = writeln!(
            self.out,
            "{pad}const {t} {}v{} = {text};",
            self.p,
            e.index()
        );
        Ok(())
    }
}

impl ir_walk::Target for Cuda<'_> {
    fn out(&mut self) -> &mut String {
        &mut self.out
    }

    fn expressions(&self) -> &naga::Arena<naga::Expression> {
        &self.f.expressions
    }

    fn value(&self, e: Handle<naga::Expression>) -> Result<String, Fail> {
        Cuda::value(self, e)
    }

    fn emit(&mut self, e: Handle<naga::Expression>, pad: &str) -> Result<(), Fail> {
        Cuda::emit(self, e, pad)
    }

    fn looped(
        &mut self,
        body: &naga::Block,
        continuing: &naga::Block,
        break_if: Option<Handle<naga::Expression>>,
        depth: usize,
    ) -> Result<(), Fail> {
        // WGSL runs `continuing` (and its `break if`) after each pass of the body, `continue`
        // included: here at the top of every pass but the first
        let pad = "    ".repeat(depth);
        let first = format!("{}first{}", self.p, self.out.len());
        let _ = writeln!(
            self.out,
            "{pad}for (bool {first} = true;; {first} = false) {{\n{pad}    if (!{first}) {{"
        );
        ir_walk::block(self, continuing, depth + 2)?;
        if let Some(c) = break_if {
            let c = Cuda::value(self, c)?;
            let _ = writeln!(self.out, "{pad}        if ({c}) break;");
        }
        let _ = writeln!(self.out, "{pad}    }}");
        ir_walk::block(self, body, depth + 1)?;
        let _ = writeln!(self.out, "{pad}}}");
        Ok(())
    }

    fn ret(&mut self, value: Option<Handle<naga::Expression>>, pad: &str) -> Result<(), Fail> {
        match value {
            Some(v) => {
                let v = Cuda::value(self, v)?;
                let _ = writeln!(self.out, "{pad}return {v};");
            }
            None => {
                let _ = writeln!(self.out, "{pad}return;");
            }
        }
        Ok(())
    }

    fn store(
        &mut self,
        l: Handle<naga::LocalVariable>,
        value: Handle<naga::Expression>,
        pad: &str,
    ) -> Result<(), Fail> {
        let v = Cuda::value(self, value)?;
        let _ = writeln!(self.out, "{pad}{}l{} = {v};", self.p, l.index());
        Ok(())
    }

    fn call(
        &mut self,
        function: Handle<naga::Function>,
        arguments: &[Handle<naga::Expression>],
        result: Option<Handle<naga::Expression>>,
        pad: &str,
        span: naga::Span,
    ) -> Result<(), Fail> {
        let name = self.module.functions[function]
            .name
            .clone()
            .unwrap_or_default();
        let args = arguments
            .iter()
            .map(|&a| Cuda::value(self, a))
            .collect::<Result<Vec<_>, _>>()?
            .join(", ");
        match result {
            Some(r) => {
                let t = type_name(self.ty(r))
                    .ok_or((Some(span), "a call result not translated".to_string()))?;
                let _ = writeln!(
                    self.out,
                    "{pad}const {t} {}v{} = {name}({args});",
                    self.p,
                    r.index()
                );
            }
            None => {
                let _ = writeln!(self.out, "{pad}{name}({args});");
            }
        }
        Ok(())
    }
}

fn literal(l: Literal) -> Option<String> {
    Some(match l {
        Literal::F32(x) => format!("{x:?}f"),
        Literal::AbstractFloat(x) => format!("{:?}f", x as f32),
        Literal::U32(x) => format!("{x}u"),
        Literal::I32(x) => format!("({x})"),
        Literal::AbstractInt(x) => format!("({x})"),
        Literal::Bool(x) => x.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_translates_with_its_helpers_loops_and_captured_reads() {
        let src = "fn bucket(i: u32, j: u32) -> u32 {
    let rel = i32(j) - i32(i);
    if (rel > 3) { return 3u; }
    return u32(abs(rel));
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    var t = s;
    for (var k = 0u; k < 3u; k++) {
        if (k == h) { continue; }
        t = t + 0.5 * tanh(t) * table(bucket(i, j) + k);
    }
    return select(t, -t, s < 0.0) % 2.5;
}";
        let c = translate(src, "fn table(i: u32) -> f32 { return 0.0; }", &["table"]).unwrap();
        for want in [
            "__device__ __forceinline__ unsigned int bucket(unsigned int gen_a0, unsigned int gen_a1);",
            "__device__ __forceinline__ float score_mod(float gen_a0, unsigned int gen_a1",
            "tanhf(",
            "fmodf(",
            "for (bool gen_first",
            "continue;",
            "= table(",
            "abs(",
        ] {
            assert!(c.contains(want), "{want}\n{c}");
        }
        assert!(!c.contains("float table("), "{c}");
        let bad = "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let v = vec3<f32>(s, s, s);
    return v.z;
}";
        let why = translate(bad, "", &[]).unwrap_err();
        assert!(
            why.starts_with("line 2") || why.starts_with("line 3"),
            "{why}"
        );
    }
}
