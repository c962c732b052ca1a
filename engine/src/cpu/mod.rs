//! The CPU reference arm: the render's three arms ([`crate::arms`]) on the
//! host in f32, built from the reference math in [`crate::models`] and
//! [`crate::ops`] (which the CUDA arm's checks also compare against):
//! [`text`] (T5), [`denoise`] (the transformer's loop) and [`decode`] (the
//! video VAE).

pub mod decode;
pub mod denoise;
pub mod text;
