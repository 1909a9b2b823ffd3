# Sourced by the bench scripts: ggml's SIMD options for this CPU. llama-cpp-sys-2 forwards GGML_*
# variables to cmake but builds ggml for baseline x86-64 unless told, which would make every
# ggml figure meaningless. Keep these identical between runs or cargo rebuilds llama.cpp.
# Building ggml needs cmake and libclang (bindgen): installed here when missing.
bash "$(dirname "${BASH_SOURCE[0]}")/../../scripts/setup.sh" --build-only
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { case " $flags " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
if [ "$(uname -m)" = x86_64 ]; then
  export GGML_AVX=$(has avx) GGML_AVX2=$(has avx2) GGML_FMA=$(has fma) GGML_F16C=$(has f16c)
  export GGML_BMI2=$(has bmi2) GGML_AVX_VNNI=$(has avx_vnni) GGML_AVX512=$(has avx512f)
  export GGML_AVX512_VNNI=$(has avx512_vnni) GGML_AVX512_VBMI=$(has avx512vbmi)
  export GGML_AVX512_BF16=$(has avx512_bf16)
fi
export GGML_OPENMP=OFF GGML_CCACHE=OFF
