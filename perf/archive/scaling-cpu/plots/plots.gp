# Written by perf/scaling/scaling.py plot; run in this folder: gnuplot plots.gp
reset
set terminal pngcairo size 960,600 noenhanced
set output 'throughput.png'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set logscale y 2
set ylabel 'tokens/s (job)'
set title 'scaling-cpu: throughput (dashed: ideal)'
plot 'data/series0.dat' using 1:2 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:2 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:2 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4', \
     'data/series0.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle, \
     'data/series1.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle, \
     'data/series2.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle
unset output
reset
set terminal pngcairo size 960,600 noenhanced
set output 'efficiency.png'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set yrange [0:1.15<*]
set ylabel 'scaling efficiency'
set title 'scaling-cpu: efficiency'
plot 1 with lines dt 2 lc rgb 'gray40' title 'ideal', \
     'data/series0.dat' using 1:4 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:4 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:4 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4'
unset output
reset
set terminal pngcairo size 960,600 noenhanced
set output 'memory.png'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set yrange [0:*]
set ylabel 'peak memory per rank (MiB)'
set title 'scaling-cpu: memory per rank'
plot 'data/series0.dat' using 1:5 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:5 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:5 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4'
unset output
reset
set terminal pngcairo size 960,600 noenhanced
set output 'breakdown.png'
set style data histograms
set style histogram rowstacked
set boxwidth 0.75
set style fill solid 0.85 border -1
set grid ytics
set key outside right top
set xtics rotate by -45
set yrange [0:*]
set xlabel 'ranks:dp,pp,tp (in order of ranks, i.e. log2 spacing)'
set ylabel 'median step time (ms)'
set title 'scaling-cpu: step time breakdown'
plot 'data/breakdown.dat' using 2:xtic(1) title 'compute', '' using 3 title 'exposed comm', '' using 4 title 'bubble'
unset output
reset
set terminal svg size 960,600 dynamic noenhanced
set output 'throughput.svg'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set logscale y 2
set ylabel 'tokens/s (job)'
set title 'scaling-cpu: throughput (dashed: ideal)'
plot 'data/series0.dat' using 1:2 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:2 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:2 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4', \
     'data/series0.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle, \
     'data/series1.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle, \
     'data/series2.dat' using 1:3 with lines dt 2 lc rgb 'gray40' notitle
unset output
reset
set terminal svg size 960,600 dynamic noenhanced
set output 'efficiency.svg'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set yrange [0:1.15<*]
set ylabel 'scaling efficiency'
set title 'scaling-cpu: efficiency'
plot 1 with lines dt 2 lc rgb 'gray40' title 'ideal', \
     'data/series0.dat' using 1:4 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:4 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:4 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4'
unset output
reset
set terminal svg size 960,600 dynamic noenhanced
set output 'memory.svg'
set logscale x 2
set xrange [0.70922:11.28]
set xtics ("1" 1, "2" 2, "4" 4, "8" 8)
set xlabel 'ranks (log2 scale)'
set grid
set key outside right top
set pointsize 1.2
set yrange [0:*]
set ylabel 'peak memory per rank (MiB)'
set title 'scaling-cpu: memory per rank'
plot 'data/series0.dat' using 1:5 with linespoints lw 2 title 'pp=1 tp=1 ZeRO 0 mb 4', \
     'data/series1.dat' using 1:5 with linespoints lw 2 title 'pp=1 tp=2 ZeRO 0 mb 4', \
     'data/series2.dat' using 1:5 with linespoints lw 2 title 'pp=2 tp=1 ZeRO 0 mb 4'
unset output
reset
set terminal svg size 960,600 dynamic noenhanced
set output 'breakdown.svg'
set style data histograms
set style histogram rowstacked
set boxwidth 0.75
set style fill solid 0.85 border -1
set grid ytics
set key outside right top
set xtics rotate by -45
set yrange [0:*]
set xlabel 'ranks:dp,pp,tp (in order of ranks, i.e. log2 spacing)'
set ylabel 'median step time (ms)'
set title 'scaling-cpu: step time breakdown'
plot 'data/breakdown.dat' using 2:xtic(1) title 'compute', '' using 3 title 'exposed comm', '' using 4 title 'bubble'
unset output
