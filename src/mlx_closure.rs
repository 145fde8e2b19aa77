//! Rust functions as MLX closures (`mlx_closure`), for the transforms
//! mlx-rs does not wrap: gradient checkpointing (`autodiff::remat`) and
//! compiled layer pieces (`model::compiled`).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use mlx_rs::Array;

/// The Rust function behind a closure.
pub(crate) type Body = dyn FnMut(&[Array]) -> Result<Vec<Array>>;

struct Payload {
    body: Box<Body>,
    error: Arc<Mutex<Option<String>>>,
}

/// An owned MLX closure and the slot where its Rust function leaves its last
/// error (MLX itself only sees a failure code).
pub(crate) struct Closure {
    handle: mlx_sys::mlx_closure,
    error: Arc<Mutex<Option<String>>>,
}

impl Closure {
    /// Wraps `body`; MLX may call it from any later application of this
    /// closure or of a transform of it.
    pub(crate) fn new<F>(body: F) -> Self
    where
        F: FnMut(&[Array]) -> Result<Vec<Array>> + 'static,
    {
        let error = Arc::new(Mutex::new(None));
        let payload = Box::new(Payload {
            body: Box::new(body),
            error: error.clone(),
        });
        // SAFETY: the payload goes to MLX with its destructor; MLX keeps it
        // alive as long as any copy of the closure exists.
        let handle = unsafe {
            mlx_sys::mlx_closure_new_func_payload(
                Some(trampoline),
                Box::into_raw(payload) as *mut c_void,
                Some(drop_payload),
            )
        };
        Self { handle, error }
    }

    /// `transform(self)`: a closure MLX made from this one (checkpointed,
    /// compiled), reporting errors through the same slot.
    pub(crate) fn transformed(
        &self,
        what: &str,
        transform: impl FnOnce(*mut mlx_sys::mlx_closure, mlx_sys::mlx_closure) -> i32,
    ) -> Result<Self> {
        // SAFETY: `wrapped` is a fresh handle that the transform fills; it is
        // freed here when the transform fails.
        unsafe {
            let mut wrapped = mlx_sys::mlx_closure_new();
            if transform(&mut wrapped, self.handle) != 0 {
                mlx_sys::mlx_closure_free(wrapped);
                return Err(anyhow!("mlx {what} failed"));
            }
            Ok(Self {
                handle: wrapped,
                error: self.error.clone(),
            })
        }
    }

    /// Applies the closure to `inputs`.
    pub(crate) fn apply(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        // SAFETY: the vectors made here are freed on every path; the output
        // arrays are copied out (new references) before their vector is freed.
        unsafe {
            let input = mlx_sys::mlx_vector_array_new();
            for a in inputs {
                mlx_sys::mlx_vector_array_append_value(input, a.as_ptr());
            }
            let mut output = mlx_sys::mlx_vector_array_new();
            let rc = mlx_sys::mlx_closure_apply(&mut output, self.handle, input);
            mlx_sys::mlx_vector_array_free(input);
            if rc != 0 {
                mlx_sys::mlx_vector_array_free(output);
                let msg = self.error.lock().ok().and_then(|mut e| e.take());
                return Err(anyhow!(
                    "{}",
                    msg.unwrap_or_else(|| "an MLX closure failed".into())
                ));
            }
            let out = vector_values(output);
            mlx_sys::mlx_vector_array_free(output);
            Ok(out)
        }
    }
}

impl Drop for Closure {
    fn drop(&mut self) {
        // SAFETY: the handle is owned by this value and freed once.
        unsafe { mlx_sys::mlx_closure_free(self.handle) };
    }
}

/// The arrays of `v` as owned handles (each a new reference).
///
/// # Safety
/// `v` must be a live `mlx_vector_array` for the duration of the call.
unsafe fn vector_values(v: mlx_sys::mlx_vector_array) -> Vec<Array> {
    let n = mlx_sys::mlx_vector_array_size(v);
    (0..n)
        .map(|i| {
            let mut a = mlx_sys::mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut a, v, i);
            Array::from_ptr(a)
        })
        .collect()
}

extern "C" fn trampoline(
    ret: *mut mlx_sys::mlx_vector_array,
    input: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> i32 {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `payload` is the `Payload` boxed in `Closure::new`, alive
        // while MLX holds the closure; `input` is a valid vector for this call.
        let payload = unsafe { &mut *(payload as *mut Payload) };
        let args = unsafe { vector_values(input) };
        match (payload.body)(&args) {
            Ok(out) => {
                let ptrs: Vec<mlx_sys::mlx_array> = out.iter().map(|a| a.as_ptr()).collect();
                // SAFETY: `ret` points at the result handle MLX made for this
                // call; `set_data` fills it (allocating when it is empty).
                unsafe { mlx_sys::mlx_vector_array_set_data(ret, ptrs.as_ptr(), ptrs.len()) }
            }
            Err(e) => {
                if let Ok(mut slot) = payload.error.lock() {
                    *slot = Some(format!("{e:#}"));
                }
                1
            }
        }
    }));
    result.unwrap_or(1)
}

extern "C" fn drop_payload(payload: *mut c_void) {
    // SAFETY: called once by MLX with the pointer from `Box::into_raw`.
    unsafe { drop(Box::from_raw(payload as *mut Payload)) };
}
