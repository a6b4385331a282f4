// Clock estimate: 2e9 dependent adds (one per cycle), then madd throughput with the
// compiler's register allocation. gcc -O2 -mavx2 -o /tmp/c docs/cpu-runs/2026-11-27/clock_estimate.c && /tmp/c
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
int main(){
  struct timespec a,b; long n=2000000000; long x=0;
  clock_gettime(CLOCK_MONOTONIC,&a);
  for(long i=0;i<n;i++){ __asm__ volatile("add $1, %0" : "+r"(x)); }
  clock_gettime(CLOCK_MONOTONIC,&b);
  double t=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9;
  printf("%.2f GHz (approx, 1 add/cycle chain)\n", n/t/1e9);
  // vpmaddwd throughput: 8 independent chains
  __m256i acc[8]; for(int j=0;j<8;j++) acc[j]=_mm256_set1_epi32(j);
  __m256i w=_mm256_set1_epi16(3), xx=_mm256_set1_epi16(5);
  long m=200000000;
  clock_gettime(CLOCK_MONOTONIC,&a);
  for(long i=0;i<m;i++){ for(int j=0;j<8;j++){ acc[j]=_mm256_add_epi32(acc[j],_mm256_madd_epi16(w,xx)); __asm__ volatile("" : "+x"(acc[j])); } }
  clock_gettime(CLOCK_MONOTONIC,&b);
  t=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9;
  printf("madd+add: %.2f G pairs/s\n", m*8/t/1e9);
  clock_gettime(CLOCK_MONOTONIC,&a);
  for(long i=0;i<m;i++){ for(int j=0;j<8;j++){ acc[j]=_mm256_madd_epi16(acc[j],xx); __asm__ volatile("" : "+x"(acc[j])); } }
  clock_gettime(CLOCK_MONOTONIC,&b);
  t=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9;
  printf("madd chain x8: %.2f G madd/s\n", m*8/t/1e9);
  __m256i u=_mm256_set1_epi8(3);
  clock_gettime(CLOCK_MONOTONIC,&a);
  for(long i=0;i<m;i++){ for(int j=0;j<8;j++){ acc[j]=_mm256_maddubs_epi16(u,acc[j]); __asm__ volatile("" : "+x"(acc[j])); } }
  clock_gettime(CLOCK_MONOTONIC,&b);
  t=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9;
  printf("maddubs chain x8: %.2f G/s\n", m*8/t/1e9);
  int s=0; for(int j=0;j<8;j++) s+=_mm256_extract_epi32(acc[j],0); return s==12345;
}
