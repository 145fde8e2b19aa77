//! Gradient checkpointing: runs a function so that autodiff keeps only its
//! inputs and recomputes its intermediates during the backward pass
//! (`mlx::core::checkpoint`, which mlx-rs does not wrap).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use mlx_rs::Array;

type Body = dyn FnMut(&[Array]) -> Result<Vec<Array>>;

struct Payload {
    body: Box<Body>,
    error: Arc<Mutex<Option<String>>>,
}

/// Applies `body` to `inputs` under a checkpoint. `body` owns what it
/// captures: it runs again when the gradient is evaluated.
pub(crate) fn checkpointed<F>(body: F, inputs: &[Array]) -> Result<Vec<Array>>
where
    F: FnMut(&[Array]) -> Result<Vec<Array>> + 'static,
{
    let error = Arc::new(Mutex::new(None));
    let payload = Box::new(Payload {
        body: Box::new(body),
        error: error.clone(),
    });
    // SAFETY: the payload is handed to MLX together with its destructor; MLX
    // keeps it alive as long as any copy of the closure (including the one in
    // the checkpoint's backward) exists. The vectors and closures created here
    // are freed on every path.
    unsafe {
        let raw = mlx_sys::mlx_closure_new_func_payload(
            Some(trampoline),
            Box::into_raw(payload) as *mut c_void,
            Some(drop_payload),
        );
        let mut wrapped = mlx_sys::mlx_closure_new();
        let rc = mlx_sys::mlx_checkpoint(&mut wrapped, raw);
        mlx_sys::mlx_closure_free(raw);
        if rc != 0 {
            mlx_sys::mlx_closure_free(wrapped);
            bail!("mlx checkpoint failed");
        }
        let input = mlx_sys::mlx_vector_array_new();
        for a in inputs {
            mlx_sys::mlx_vector_array_append_value(input, a.as_ptr());
        }
        let mut output = mlx_sys::mlx_vector_array_new();
        let rc = mlx_sys::mlx_closure_apply(&mut output, wrapped, input);
        mlx_sys::mlx_vector_array_free(input);
        mlx_sys::mlx_closure_free(wrapped);
        if rc != 0 {
            mlx_sys::mlx_vector_array_free(output);
            let msg = error.lock().ok().and_then(|mut e| e.take());
            return Err(anyhow!(
                "checkpointed function failed: {}",
                msg.unwrap_or_else(|| "unknown error".into())
            ));
        }
        let out = vector_values(output);
        mlx_sys::mlx_vector_array_free(output);
        Ok(out)
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
        // SAFETY: `payload` is the `Payload` boxed in `checkpointed`, alive
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
