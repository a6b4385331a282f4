// Throughput of vpmaddwd, vpmaddubsw and (VEX) vpdpwssd on 256-bit registers: 12 independent
// chains, so latency does not bound them. Build and run:
//   gcc -O2 -mavx2 -mavxvnni -o /tmp/t docs/cpu-runs/2026-11-27/vpmaddwd_throughput.c && /tmp/t
// The per-cycle figures divide by 4.13 GHz, measured the same day with a chain of dependent adds.
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
int main(){
  long m=300000000;
  __m256i a0=_mm256_set1_epi32(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0,a10=a0,a11=a0;
  __m256i w=_mm256_set1_epi16(3);
  double t=now();
  for(long i=0;i<m;i++){
    __asm__ volatile(
      "vpmaddwd %[w], %[a0], %[a0]\n vpmaddwd %[w], %[a1], %[a1]\n vpmaddwd %[w], %[a2], %[a2]\n vpmaddwd %[w], %[a3], %[a3]\n"
      "vpmaddwd %[w], %[a4], %[a4]\n vpmaddwd %[w], %[a5], %[a5]\n vpmaddwd %[w], %[a6], %[a6]\n vpmaddwd %[w], %[a7], %[a7]\n"
      "vpmaddwd %[w], %[a8], %[a8]\n vpmaddwd %[w], %[a9], %[a9]\n vpmaddwd %[w], %[a10], %[a10]\n vpmaddwd %[w], %[a11], %[a11]\n"
      : [a0]"+x"(a0),[a1]"+x"(a1),[a2]"+x"(a2),[a3]"+x"(a3),[a4]"+x"(a4),[a5]"+x"(a5),[a6]"+x"(a6),[a7]"+x"(a7),[a8]"+x"(a8),[a9]"+x"(a9),[a10]"+x"(a10),[a11]"+x"(a11) : [w]"x"(w));
  }
  t=now()-t; printf("vpmaddwd ymm x12 chains: %.2f per ns = %.2f/cycle @4.13\n", m*12/t/1e9, m*12/t/1e9/4.13);
  t=now();
  for(long i=0;i<m;i++){
    __asm__ volatile(
      "vpmaddubsw %[w], %[a0], %[a0]\n vpmaddubsw %[w], %[a1], %[a1]\n vpmaddubsw %[w], %[a2], %[a2]\n vpmaddubsw %[w], %[a3], %[a3]\n"
      "vpmaddubsw %[w], %[a4], %[a4]\n vpmaddubsw %[w], %[a5], %[a5]\n vpmaddubsw %[w], %[a6], %[a6]\n vpmaddubsw %[w], %[a7], %[a7]\n"
      "vpmaddubsw %[w], %[a8], %[a8]\n vpmaddubsw %[w], %[a9], %[a9]\n vpmaddubsw %[w], %[a10], %[a10]\n vpmaddubsw %[w], %[a11], %[a11]\n"
      : [a0]"+x"(a0),[a1]"+x"(a1),[a2]"+x"(a2),[a3]"+x"(a3),[a4]"+x"(a4),[a5]"+x"(a5),[a6]"+x"(a6),[a7]"+x"(a7),[a8]"+x"(a8),[a9]"+x"(a9),[a10]"+x"(a10),[a11]"+x"(a11) : [w]"x"(w));
  }
  t=now()-t; printf("vpmaddubsw ymm x12: %.2f/cycle\n", m*12/t/1e9/4.13);
  t=now();
  for(long i=0;i<m;i++){
    __asm__ volatile(
      "vpdpwssd %[w], %[a0], %[a0]\n vpdpwssd %[w], %[a1], %[a1]\n vpdpwssd %[w], %[a2], %[a2]\n vpdpwssd %[w], %[a3], %[a3]\n"
      "vpdpwssd %[w], %[a4], %[a4]\n vpdpwssd %[w], %[a5], %[a5]\n vpdpwssd %[w], %[a6], %[a6]\n vpdpwssd %[w], %[a7], %[a7]\n"
      "vpdpwssd %[w], %[a8], %[a8]\n vpdpwssd %[w], %[a9], %[a9]\n vpdpwssd %[w], %[a10], %[a10]\n vpdpwssd %[w], %[a11], %[a11]\n"
      : [a0]"+x"(a0),[a1]"+x"(a1),[a2]"+x"(a2),[a3]"+x"(a3),[a4]"+x"(a4),[a5]"+x"(a5),[a6]"+x"(a6),[a7]"+x"(a7),[a8]"+x"(a8),[a9]"+x"(a9),[a10]"+x"(a10),[a11]"+x"(a11) : [w]"x"(w));
  }
  t=now()-t; printf("vpdpwssd ymm x12 (vex): %.2f/cycle\n", m*12/t/1e9/4.13);
  long s=_mm256_extract_epi32(a0,0)+_mm256_extract_epi32(a11,0); return s==7;
}
