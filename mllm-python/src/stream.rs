//! `Model.stream`: generation on a worker thread that sends each piece of
//! text through a channel; the Python iterator waits for pieces with the
//! GIL released and checks for Ctrl-C while it waits. Dropping the
//! iterator stops the generation at its next token.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mllm_core::Error;
use mllm_models::Tokenizer;
use pyo3::prelude::*;

use crate::errors::{to_py, MllmError};
use crate::model::lock;
use crate::sampling::{run, Sampling};

/// How long the iterator waits for a piece before checking for signals.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// What the worker sends.
enum Message {
    Text(String),
    Failed(Error),
}

/// An iterator over the pieces of text of one generation.
#[pyclass(module = "mllm_rs")]
pub struct TextIterator {
    pieces: Mutex<Option<Receiver<Message>>>,
}

impl TextIterator {
    /// Starts generating from `ids` on a worker thread.
    pub fn start(
        model: Arc<Mutex<mllm_models::Model>>,
        tokenizer: Arc<Tokenizer>,
        ids: Vec<u32>,
        sampling: Sampling,
    ) -> Self {
        let (tx, rx) = sync_channel(64);
        std::thread::spawn(move || {
            let Ok(mut model) = lock(&model) else {
                let _ = tx.send(Message::Failed(Error::InvalidInput(
                    "the model is unusable after a failure in another thread".into(),
                )));
                return;
            };
            let result = run(&mut model, &tokenizer, &ids, &sampling, &mut |piece| {
                tx.send(Message::Text(piece.to_string())).is_ok()
            });
            if let Err(e) = result {
                let _ = tx.send(Message::Failed(e));
            }
        });
        TextIterator {
            pieces: Mutex::new(Some(rx)),
        }
    }
}

#[pymethods]
impl TextIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self
            .pieces
            .lock()
            .map_err(|_| MllmError::new_err("the stream failed in another thread"))?;
        let Some(rx) = guard.as_mut() else {
            return Ok(None);
        };
        loop {
            let waiting = &mut *rx;
            match py.detach(move || waiting.recv_timeout(SIGNAL_CHECK)) {
                Ok(Message::Text(piece)) => return Ok(Some(piece)),
                Ok(Message::Failed(e)) => {
                    *guard = None;
                    return Err(to_py(e));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    *guard = None;
                    return Ok(None);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        // Dropping the receiver stops the worker.
                        *guard = None;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Stops the generation (the iterator then ends).
    fn close(&self) -> PyResult<()> {
        let mut guard = self
            .pieces
            .lock()
            .map_err(|_| MllmError::new_err("the stream failed in another thread"))?;
        *guard = None;
        Ok(())
    }
}
