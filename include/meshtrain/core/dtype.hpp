#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "meshtrain/core/kokkos_compat.hpp"

namespace meshtrain {

// Element types that cross communicators and files.
enum class DType { f32, f64, i32, i64, u8, bf16, f16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::u8; };
#if MESHTRAIN_HAVE_BF16
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<fp16> { static constexpr DType value = DType::f16; };
#endif
template <class T> inline constexpr DType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

}  // namespace meshtrain
