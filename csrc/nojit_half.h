/* Half-precision conversions (round to nearest even) for fp16/bf16 scalar parameters: one copy, used by the
   cffi launcher's packer (nojit_cuda.c) and the one-call fast path (nojit_fast.c), which must pack identically. */
#ifndef NOJIT_HALF_H
#define NOJIT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t to_bf16(double d) {
  float f = (float)d;
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline uint16_t to_fp16(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff)
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 31)
    return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10)
      return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1)))
      half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
    half++;
  return (uint16_t)half;
}

#endif /* NOJIT_HALF_H */
