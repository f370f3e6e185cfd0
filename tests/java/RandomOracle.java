// The JVM's own java.util.Random and Math, for tests/unit/test_nexmark.py: for each seed in
// [first, last), one line of draws in a fixed order (see the test for the order).
import java.util.Random;

public class RandomOracle {
    public static void main(String[] args) {
        long first = Long.parseLong(args[0]);
        long last = Long.parseLong(args[1]);
        StringBuilder out = new StringBuilder();
        for (long seed = first; seed < last; seed++) {
            Random r = new Random(seed);
            double d = r.nextDouble();
            out.append(Math.round(Math.pow(10.0, d * 6.0) * 100.0)).append(' ')
               .append(Double.doubleToLongBits(d)).append(' ')
               .append(r.nextInt()).append(' ')
               .append(r.nextInt(13)).append(' ')
               .append(r.nextInt(64)).append(' ')
               .append(r.nextInt(1500000000)).append(' ')
               .append(r.nextLong()).append(' ')
               .append(r.nextInt() % 26).append(' ')
               .append(r.nextInt() / 26).append('\n');
        }
        System.out.print(out);
    }
}
