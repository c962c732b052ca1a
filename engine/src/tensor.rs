//! A dense, row-major `f32` tensor: the CPU arm's only array type.
//!
//! Deliberately small: a shape and a contiguous buffer. Ops live in `crate::ops`
//! as free functions over slices and tensors so each can be tested alone.

/// A shape and data mismatch, or an index outside a shape.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    /// The data length is not the product of the shape.
    #[error("shape {shape:?} needs {expected} elements, got {got}")]
    Length {
        /// Requested shape.
        shape: Vec<usize>,
        /// Product of the shape.
        expected: usize,
        /// Data length given.
        got: usize,
    },
}

/// A dense row-major tensor of `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor of `shape` over `data` (row-major); the lengths must agree.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Tensor, TensorError> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(TensorError::Length {
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A tensor of `shape` filled with zeros.
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
        }
    }

    /// A tensor of `shape` whose element at flat index `i` is `f(i)`.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n).map(f).collect(),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The buffer, consuming the tensor.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// The same elements under another shape with the same element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor, TensorError> {
        Tensor::new(shape, self.data)
    }

    /// Bytes held by the buffer (4 per element).
    pub fn nbytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_length_and_reshape_keeps_data() {
        assert!(matches!(
            Tensor::new(&[2, 3], vec![0.0; 5]),
            Err(TensorError::Length {
                expected: 6,
                got: 5,
                ..
            })
        ));
        let t = Tensor::from_fn(&[2, 3], |i| i as f32);
        let r = t.clone().reshape(&[3, 2]).unwrap();
        assert_eq!(r.shape(), &[3, 2]);
        assert_eq!(r.data(), t.data());
        assert!(t.reshape(&[4]).is_err());
    }
}
