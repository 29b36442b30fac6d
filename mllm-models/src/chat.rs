//! Chat templates: rendering a conversation into the model's prompt text with
//! the Jinja template that ships with the model.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{context, Environment, ErrorKind};
use mllm_core::{Error, Result};
use serde::Serialize;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template, rendered as Hugging Face's `apply_chat_template`
/// does (trimmed blocks, Python string methods available).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

/// Template instructions one rendering may run: real templates use tens
/// per message, so this allows conversations of tens of thousands of
/// messages, while a hostile template (nested loops of billions of
/// iterations) fails in well under a second instead of hanging.
pub const RENDER_FUEL: u64 = 10_000_000;

/// Most bytes a rendering may produce (far more than any context holds),
/// so a template cannot exhaust memory by writing.
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Collects rendered bytes up to [`MAX_RENDERED_BYTES`], then refuses more.
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are exposed to it.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Tokenizer(format!("chat template syntax: {e}")))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::Tokenizer(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends
    /// where the assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))?;
        let mut out = BoundedOutput::default();
        let rendered = template
            .render_captured_to(
                context! {
                    messages => Serde(messages),
                    add_generation_prompt => add_generation_prompt,
                    bos_token => &self.bos_token,
                    eos_token => &self.eos_token,
                },
                &mut out,
            )
            .map(drop);
        if out.overflowed {
            return Err(Error::Tokenizer(format!(
                "chat template failed to render: the rendered prompt is over {MAX_RENDERED_BYTES} bytes"
            )));
        }
        rendered.map_err(|e| Error::Tokenizer(format!("chat template failed to render: {e}")))?;
        String::from_utf8(out.bytes)
            .map_err(|e| Error::Tokenizer(format!("chat template wrote invalid UTF-8: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_default_system_prompt() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let text = t.render(&[Message::user("Hi")], true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let no_gen = t.render(&[Message::user("Hi")], false).unwrap();
        assert!(!no_gen.ends_with("assistant\n"));
    }

    #[test]
    fn python_methods_and_exceptions_work() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0]['content'].strip() | upper }}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[Message::user("  hey ")], false).unwrap(),
            "HEY</s>"
        );
        let err = t.render(&[Message::assistant("x")], false).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
