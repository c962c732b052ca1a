//! The device forwards, each built on [`super::kit`] with weights from
//! [`super::staging`]: the LTX-Video transformer ([`dit`]), the T5 text
//! encoder ([`t5`], lever `conditioning = device`) and the video VAE decoder
//! ([`vae`], lever `vae = device`).

pub mod dit;
pub mod t5;
pub mod vae;
