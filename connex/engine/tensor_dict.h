// The engine's names for the tensor types of the engine contract. TensorDict (name -> dtype,
// shape, bytes) is what crosses pipeline stages and what a checkpoint holds; it is defined in
// connex/pp/tensor_dict.h, with the contract. Thread-compatible (value types).
#ifndef CONNEX_ENGINE_TENSOR_DICT_H_
#define CONNEX_ENGINE_TENSOR_DICT_H_

#include "connex/pp/tensor_dict.h"

namespace connex::engine {

using pp::DType;
using pp::DTypeName;
using pp::DTypeOf;
using pp::DTypeSize;
using pp::NumElements;
using pp::ParseDType;
using pp::ShapeString;
using pp::Tensor;
using pp::TensorDict;

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_TENSOR_DICT_H_
