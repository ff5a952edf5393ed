#pragma once
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// out = a + b (out may alias a or b).
template <class T>
void residual_forward(const ExecSpace& exec, View1<T> out, View1<const T> a, View1<const T> b,
                      std::size_t n);

// y += x
template <class T>
void accumulate(const ExecSpace& exec, View1<T> y, View1<const T> x, std::size_t n);

}  // namespace meshtrain::kernels
