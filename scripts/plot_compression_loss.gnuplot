# Loss curves of scripts/compression_accuracy.sh: per-step training loss (all-rank mean),
# smoothed over 20 steps, uncompressed vs QSGD 4-bit vs 2-bit.
#   gnuplot -e "dir='DIR'; out='FILE.png'; epochs='2'; nproc='2'" scripts/plot_compression_loss.gnuplot
if (!exists("dir")) dir = "."
if (!exists("out")) out = "compression-loss.png"
if (!exists("epochs")) epochs = "?"
if (!exists("nproc")) nproc = "2"

set terminal pngcairo size 900,540 enhanced font "DejaVu Sans,11"
set output out
set datafile separator ","
set key top right box opaque
set grid lw 0.5 lc rgb "#dddddd"
set xlabel "step"
set ylabel "training loss (mean over ranks, 20-step moving average)"
set title sprintf("Fashion-MNIST ConvNet, %s ranks, %s epoch(s): gradient compression vs loss", nproc, epochs)
set yrange [0:*]

# 20-step moving average with a ring of samples (gnuplot has no rolling window built in).
n = 20
init(x) = (s0=s1=s2=s3=s4=s5=s6=s7=s8=s9=s10=s11=s12=s13=s14=s15=s16=s17=s18=s19=x, cnt=0)
shift(x) = (s19=s18, s18=s17, s17=s16, s16=s15, s15=s14, s14=s13, s13=s12, s12=s11, s11=s10, \
            s10=s9, s9=s8, s8=s7, s7=s6, s6=s5, s5=s4, s4=s3, s3=s2, s2=s1, s1=s0, s0=x, cnt=cnt+1)
avg(x) = (shift(x), (s0+s1+s2+s3+s4+s5+s6+s7+s8+s9+s10+s11+s12+s13+s14+s15+s16+s17+s18+s19)/n)

plot dir."/loss-none.csv"  every ::1 using 1:(column(1)==0 ? init($3) : 0, avg($3)) \
       with lines lw 2 lc rgb "#1f77b4" title "uncompressed fp32", \
     dir."/loss-qsgd4.csv" every ::1 using 1:(column(1)==0 ? init($3) : 0, avg($3)) \
       with lines lw 2 lc rgb "#d62728" title "QSGD 4-bit, bucket 128", \
     dir."/loss-qsgd2.csv" every ::1 using 1:(column(1)==0 ? init($3) : 0, avg($3)) \
       with lines lw 2 lc rgb "#2ca02c" title "QSGD 2-bit, bucket 128"
