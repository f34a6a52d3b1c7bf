//! The statement walk that the derivation (derive.rs) and the CUDA translation (to_cuda.rs)
//! share: naga's structured statements written out as text, in order, with each target
//! saying how it writes an expression, a loop, a store, a call and a return.

use std::fmt::Write;

use naga::{BinaryOperator as B, Handle, Statement as S};

/// A failure: where (a span of the user's source, if any) and what.
pub(super) type Fail = (Option<naga::Span>, String);

/// What a target writes; [`block`] walks the statements.
pub(super) trait Target {
    /// The text written so far.
    fn out(&mut self) -> &mut String;
    /// The function's expressions.
    fn expressions(&self) -> &naga::Arena<naga::Expression>;
    /// An expression's value as the target writes it.
    fn value(&self, e: Handle<naga::Expression>) -> Result<String, Fail>;
    /// The lines of an emitted expression.
    fn emit(&mut self, e: Handle<naga::Expression>, pad: &str) -> Result<(), Fail>;
    /// A loop: `body`, then `continuing` and its `break if`, on each pass.
    fn looped(
        &mut self,
        body: &naga::Block,
        continuing: &naga::Block,
        break_if: Option<Handle<naga::Expression>>,
        depth: usize,
    ) -> Result<(), Fail>;
    /// `return`.
    fn ret(&mut self, value: Option<Handle<naga::Expression>>, pad: &str) -> Result<(), Fail>;
    /// A store of `value` into the local variable `local` (the only pointer either takes).
    fn store(
        &mut self,
        local: Handle<naga::LocalVariable>,
        value: Handle<naga::Expression>,
        pad: &str,
    ) -> Result<(), Fail>;
    /// A call, its result named after `result`.
    fn call(
        &mut self,
        function: Handle<naga::Function>,
        arguments: &[Handle<naga::Expression>],
        result: Option<Handle<naga::Expression>>,
        pad: &str,
        span: naga::Span,
    ) -> Result<(), Fail>;
}

/// Writes `b`'s statements at `depth` (four spaces a level) through `t`.
pub(super) fn block<T: Target>(t: &mut T, b: &naga::Block, depth: usize) -> Result<(), Fail> {
    let pad = "    ".repeat(depth);
    for (st, span) in b.span_iter() {
        match st {
            S::Emit(range) => {
                for e in range.clone() {
                    t.emit(e, &pad)?;
                }
            }
            S::Block(inner) => {
                let _ = writeln!(t.out(), "{pad}{{");
                block(t, inner, depth + 1)?;
                let _ = writeln!(t.out(), "{pad}}}");
            }
            S::If {
                condition,
                accept,
                reject,
            } => {
                let c = t.value(*condition)?;
                let _ = writeln!(t.out(), "{pad}if ({c}) {{");
                block(t, accept, depth + 1)?;
                let _ = writeln!(t.out(), "{pad}}} else {{");
                block(t, reject, depth + 1)?;
                let _ = writeln!(t.out(), "{pad}}}");
            }
            S::Loop {
                body,
                continuing,
                break_if,
            } => t.looped(body, continuing, *break_if, depth)?,
            S::Break => {
                let _ = writeln!(t.out(), "{pad}break;");
            }
            S::Continue => {
                let _ = writeln!(t.out(), "{pad}continue;");
            }
            S::Return { value } => t.ret(*value, &pad)?,
            S::Store { pointer, value } => {
                let naga::Expression::LocalVariable(l) = t.expressions()[*pointer] else {
                    return Err((Some(*span), "a store to other than a local variable".into()));
                };
                t.store(l, *value, &pad)?
            }
            S::Call {
                function,
                arguments,
                result,
            } => t.call(*function, arguments, *result, &pad, *span)?,
            _ => {
                return Err((
                    Some(*span),
                    "a statement not taken here (switch, barriers, atomics, images, discard)"
                        .into(),
                ))
            }
        }
    }
    Ok(())
}

/// A binary operator's symbol, the same in WGSL and in CUDA C.
pub(super) fn symbol(op: B) -> &'static str {
    match op {
        B::Add => "+",
        B::Subtract => "-",
        B::Multiply => "*",
        B::Divide => "/",
        B::Modulo => "%",
        B::Equal => "==",
        B::NotEqual => "!=",
        B::Less => "<",
        B::LessEqual => "<=",
        B::Greater => ">",
        B::GreaterEqual => ">=",
        B::And => "&",
        B::ExclusiveOr => "^",
        B::InclusiveOr => "|",
        B::LogicalAnd => "&&",
        B::LogicalOr => "||",
        B::ShiftLeft => "<<",
        B::ShiftRight => ">>",
    }
}
